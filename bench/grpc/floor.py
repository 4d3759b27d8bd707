"""Benchmark: what grpcio itself spends per call and per streamed message here, with no hangup
code: the floor under the Triton bridge (a gRPC client of ``ModelInfer``) and under the gateway's
gRPC streams (a server of ``ModelStreamInfer``).

Every party is a process of its own on 127.0.0.1, kept-alive (one channel per client process),
measured by its own CPU time over the same window of the host's monotonic clock:

- **unary, the client's side** (what the bridge pays per call): a bare server answers
  ``ModelInfer`` with a fixed response without reading the request (a generic handler on raw
  bytes); the client makes ``--concurrency`` calls at a time with the bridge's payload (155 FP32
  numbers, as ``bench.short_calls.one_core`` sends Triton), in four ways: ``aio``, the asyncio API
  with the generated messages built and parsed per call; ``aio-bytes``, the same API on raw bytes
  (the request serialized once, the answer not parsed: no protobuf work at all); ``sync``, the
  blocking API from as many threads; ``aio-bytes via Envoy``, with Envoy (one worker) relaying
  HTTP/2 between them, and Envoy's own CPU per call;
- **streamed, the server's side** (what the gateway pays per response): a bare server answers
  each ``ModelStreamInfer`` call with ``--messages`` responses shaped as the gateway's (one token,
  ``triton_final_response``), ``--streams`` calls at a time, in three ways: ``aio`` (a message
  object built and written per response), ``aio-bytes`` (prebuilt bytes written per response),
  ``sync`` (the blocking API's generator, on its thread pool).

Prints µs of CPU per call (or per response) for each party, a line per round; ``--rounds``
rounds, alternating the ways. Run: ``.venv/bin/python -m bench.grpc.floor`` (about two minutes;
Envoy's row is skipped where its binary is missing). Roles run as this module with ``--role``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.grpc.paths import envoy
from bench.instruments.stats import cpu_seconds
from hangup_contract.protos import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
INFER = f"/{SERVICE}/ModelInfer"
STREAM = f"/{SERVICE}/ModelStreamInfer"
NUMBERS = 155
"""FP32 numbers per request: ``bench.short_calls.one_core``' 1 KiB JSON body, as the bridge sends
it."""


def infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow", id="floor")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[NUMBERS])
    tensor.contents.fp32_contents.extend([0.25] * NUMBERS)
    request.parameters["steps"].int64_param = 0
    return request


def infer_response() -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="slow", id="floor")
    out = response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[NUMBERS])
    out.contents.fp32_contents.extend([0.25] * NUMBERS)
    return response


def stream_response(index: int) -> pb.ModelStreamInferResponse:
    """One streamed token, shaped as the gateway's decoupled responses."""
    response = pb.ModelStreamInferResponse()
    infer = response.infer_response
    infer.model_name, infer.id = "hangup-sim", "floor"
    infer.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    token = b" token"
    infer.raw_output_contents.append(len(token).to_bytes(4, "little") + token)
    infer.parameters["triton_final_response"].bool_param = False
    infer.parameters["sequence_index"].int64_param = index
    return response


# --- servers ----------------------------------------------------------------------------------


def _aio_server(way: str, messages: int) -> None:
    async def serve() -> None:
        answer = infer_response().SerializeToString()
        prebuilt = stream_response(0).SerializeToString()

        async def infer(request: bytes, context: Any) -> bytes:
            return answer

        async def stream_objects(requests: Any, context: Any) -> None:
            async for _ in requests:
                for index in range(messages):
                    await context.write(stream_response(index))

        async def stream_bytes(requests: Any, context: Any) -> None:
            async for _ in requests:
                for _index in range(messages):
                    await context.write(prebuilt)

        if way == "aio":
            stream = grpc.stream_stream_rpc_method_handler(
                stream_objects,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            )
        else:
            stream = grpc.stream_stream_rpc_method_handler(stream_bytes)
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer), "ModelStreamInfer": stream},
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    uvloop.run(serve())


def _sync_server(messages: int) -> None:
    def stream(requests: Iterator[pb.ModelInferRequest], context: Any) -> Iterator[Any]:
        for _ in requests:
            for index in range(messages):
                yield stream_response(index)

    answer = infer_response().SerializeToString()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(lambda request, context: answer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            ),
        },
    )
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


# --- clients ----------------------------------------------------------------------------------


def _report(start: float, end: float, cpu0: float, cpu1: float, done: int) -> None:
    print(json.dumps({"count": done, "cpu": cpu1 - cpu0, "seconds": end - start}), flush=True)


def _aio_unary_client(args: argparse.Namespace) -> None:
    async def run() -> None:
        async with grpc.aio.insecure_channel(args.target) as channel:
            if args.way == "aio":
                call = channel.unary_unary(
                    INFER,
                    request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString,
                )
            else:
                call = channel.unary_unary(INFER)
            body = infer_request().SerializeToString()
            counted = [0]

            async def loop() -> None:
                while time.monotonic() < args.end:
                    if args.way == "aio":
                        answer = await call(infer_request())
                        assert answer.outputs[0].contents.fp32_contents
                    else:
                        await call(body)
                    if args.start <= time.monotonic() < args.end:
                        counted[0] += 1

            async def window() -> None:
                await asyncio.sleep(max(0.0, args.start - time.monotonic()))
                cpu0 = time.process_time()
                await asyncio.sleep(max(0.0, args.end - time.monotonic()))
                _report(args.start, args.end, cpu0, time.process_time(), counted[0])

            await asyncio.gather(window(), *(loop() for _ in range(args.concurrency)))

    uvloop.run(run())


def _sync_unary_client(args: argparse.Namespace) -> None:
    channel = grpc.insecure_channel(args.target)
    call = channel.unary_unary(
        INFER,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    counted = [0]
    lock = threading.Lock()

    def loop() -> None:
        while time.monotonic() < args.end:
            answer = call(infer_request())
            assert answer.outputs[0].contents.fp32_contents
            if args.start <= time.monotonic() < args.end:
                with lock:
                    counted[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, args.start - time.monotonic()))
    cpu0 = time.process_time()
    time.sleep(max(0.0, args.end - time.monotonic()))
    cpu1 = time.process_time()
    for thread in threads:
        thread.join()
    channel.close()
    _report(args.start, args.end, cpu0, cpu1, counted[0])


def _stream_client(args: argparse.Namespace) -> None:
    """Streams of ``--messages`` responses, ``--concurrency`` at a time; counts responses."""

    async def run() -> None:
        async with grpc.aio.insecure_channel(args.target) as channel:
            call = channel.stream_stream(STREAM)
            body = infer_request().SerializeToString()
            counted = [0]

            async def loop() -> None:
                while time.monotonic() < args.end:
                    stream = call()
                    await stream.write(body)
                    for _ in range(args.messages):
                        await stream.read()
                        if args.start <= time.monotonic() < args.end:
                            counted[0] += 1
                    stream.cancel()

            async def window() -> None:
                await asyncio.sleep(max(0.0, args.start - time.monotonic()))
                await asyncio.sleep(max(0.0, args.end - time.monotonic()))
                _report(args.start, args.end, 0.0, 0.0, counted[0])

            await asyncio.gather(window(), *(loop() for _ in range(args.concurrency)))

    uvloop.run(run())


# --- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(way: str, messages: int) -> Iterator[tuple[str, int]]:
    """A bare floor server (``way``) in a process of its own: its address and pid."""
    argv = [sys.executable, "-m", "bench.grpc.floor", "--role", "server", "--way", way,
            "--messages", str(messages)]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(10)


def _measure(
    role: str, way: str, target: str, args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, float]:
    """One window: the client's count and CPU, and each of ``pids``' CPU over the window."""
    start = time.monotonic() + args.warmup + 0.5
    end = start + args.window
    argv = [sys.executable, "-m", "bench.grpc.floor", "--role", role, "--way", way,
            "--target", target, "--concurrency", str(args.concurrency if role == "unary"
                                                      else args.streams),
            "--messages", str(args.messages), "--start", str(start), "--end", str(end)]  # fmt: skip
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    time.sleep(max(0.0, start - time.monotonic()))
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(max(0.0, end - time.monotonic()))
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    out, _ = client.communicate(timeout=args.window + 60)
    row = json.loads(out.strip().splitlines()[-1])
    count = max(1, row["count"])
    result = {"per_s": row["count"] / row["seconds"]}
    if role == "unary":
        result["client_us"] = row["cpu"] / count * 1e6
    for name in pids:
        result[f"{name}_us"] = (after[name] - before[name]) / count * 1e6
    return result


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    rows: dict[str, list[dict[str, float]]] = {}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.rounds):
        for way in ("aio", "aio-bytes", "sync"):
            with server_process("aio-bytes", args.messages) as (target, pid):
                row = _measure("unary", way, target, args, {"server": pid})
            rows.setdefault(f"unary {way}", []).append(row)
            print(f"round {round_ + 1} unary {way}: {_line(row)}", flush=True)
        if args.envoy:
            with (
                server_process("aio-bytes", args.messages) as (target, pid),
                envoy(work, target) as (relayed, envoy_pid),
            ):
                row = _measure(
                    "unary", "aio-bytes", relayed, args, {"server": pid, "envoy": envoy_pid}
                )
            rows.setdefault("unary aio-bytes via Envoy", []).append(row)
            print(f"round {round_ + 1} unary aio-bytes via Envoy: {_line(row)}", flush=True)
        for way in ("aio", "aio-bytes", "sync"):
            with server_process(way, args.messages) as (target, pid):
                row = _measure("stream", way, target, args, {"server": pid})
            rows.setdefault(f"stream {way}", []).append(row)
            print(f"round {round_ + 1} stream {way}: {_line(row)}", flush=True)
    return rows


def _line(row: dict[str, float]) -> str:
    return ", ".join(
        f"{k.removesuffix('_us')} {v:.0f} µs" if k.endswith("_us") else f"{v:.0f}/s"
        for k, v in row.items()
    )


def report(rows: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| way | per second | " + " | ".join(("client µs", "server µs", "Envoy µs")) + " |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, runs in rows.items():
        cells = []
        for key in ("per_s", "client_us", "server_us", "envoy_us"):
            values = [r[key] for r in runs if key in r]
            if not values:
                cells.append("")
                continue
            mid = statistics.median(values)
            cells.append(f"{mid:.0f} ({min(values):.0f}-{max(values):.0f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--role", choices=("run", "server", "unary", "stream"), default="run")
    parser.add_argument("--way", default="aio")
    parser.add_argument("--target", default="")
    parser.add_argument("--concurrency", type=int, default=16, help="unary calls in flight")
    parser.add_argument("--streams", type=int, default=16, help="streams at once")
    parser.add_argument("--messages", type=int, default=64, help="responses per stream")
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--end", type=float, default=0.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-envoy", dest="envoy", action="store_false")
    parser.add_argument("--work", default=".demo/bench-grpc-floor")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.role == "server":
        if args.way == "sync":
            _sync_server(args.messages)
        else:
            _aio_server(args.way, args.messages)
    elif args.role == "unary":
        if args.way == "sync":
            _sync_unary_client(args)
        else:
            _aio_unary_client(args)
    elif args.role == "stream":
        _stream_client(args)
    else:
        rows = run(args)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        print(report(rows))


if __name__ == "__main__":
    main()
