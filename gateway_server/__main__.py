from gateway_server.cli import main

# vLLM spawns its engine core in a new process: the guard keeps that child from re-running main().
if __name__ == "__main__":
    main()
