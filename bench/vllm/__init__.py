"""What does the real vLLM engine (CPU, tiny local model) do after a hang-up, through hangup and
through vLLM's own server, and how soon does a killed engine serve again?

``hangup``: hang-ups in prefill and decode per setup; ``streams``: whether streams leave token by
token and every hang-up is a cancellation; ``engine_restart``: an engine core killed, the gateway
serving again by itself."""
