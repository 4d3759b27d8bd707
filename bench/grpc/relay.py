"""Benchmark: what a relay costs a gRPC client, direct vs hangup's proxy vs Envoy.

The gateway runs a fast simulated engine (0.5 ms steps) so the relay, not the engine, shows:

- ``unary``: ModelInfer with one output token, one call at a time: latency p50/p99 (ms);
- ``first response``: a new ModelStreamInfer stream per request, one token: time from opening
  the stream to its first response, p50/p99 (ms);
- ``responses/s``: ``--streams`` streams decoding at once, responses the client receives per
  second over ``--window`` seconds, and the relay's CPU per 1000 responses (ms).

Run: ``.venv/bin/python -m bench.grpc.relay`` (``--calls 200`` for a quicker run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import grpc

from bench.base.processes import REPO
from bench.grpc.paths import PATHS, path, stubs, text_request
from bench.instruments.stats import cpu_seconds, median_p99


async def unary_latencies(infer: Any, calls: int) -> list[float]:
    took = []
    for i in range(calls):
        start = time.perf_counter()
        await infer(text_request(f"u{i}", "hello", 1, stream=False))
        took.append(1000 * (time.perf_counter() - start))
    return took


async def first_responses(stream: Any, calls: int) -> list[float]:
    took = []
    for i in range(calls):
        start = time.perf_counter()
        call = stream()
        await call.write(text_request(f"s{i}", "hello", 1, stream=True))
        await call.read()
        took.append(1000 * (time.perf_counter() - start))
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return took


async def throughput(
    stream: Any, streams: int, window: float, relay: int | None
) -> tuple[float, float]:
    counts = [0] * streams
    started = [asyncio.Event() for _ in range(streams)]

    async def run(index: int) -> None:
        call = stream()
        await call.write(text_request(f"t{index}", "go", 4000, stream=True))
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await call.read() is not grpc.aio.EOF:
                counts[index] += 1
                started[index].set()

    tasks = [asyncio.create_task(run(i)) for i in range(streams)]
    await asyncio.gather(*(e.wait() for e in started))
    before, cpu_before, t0 = sum(counts), cpu_seconds(relay), time.monotonic()
    await asyncio.sleep(window)  # the measurement window itself, not a wait for an event
    after, cpu_after, t1 = sum(counts), cpu_seconds(relay), time.monotonic()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    received = after - before
    return received / (t1 - t0), 1e6 * (cpu_after - cpu_before) / max(1, received)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-grpc"
    gateway_args = ["--sim-slots", "64", "--sim-step-base", "0.0005", "--sim-step-per-seq", "0",
                    "--sim-prefill-per-token", "0"]  # fmt: skip
    print(f"{'path':>8} {'unary ms p50/p99':>17} {'first response':>15} {'responses/s':>12}"
          f" {'relay cpu ms/1k':>16}")  # fmt: skip
    for name in args.paths.split(","):
        with path(name, Path(work), gateway_args) as p:
            async with grpc.aio.insecure_channel(p.target) as channel:
                infer, stream = stubs(channel)
                await unary_latencies(infer, 20)  # warm up connections and code paths
                unary = await unary_latencies(infer, args.calls)
                first = await first_responses(stream, args.calls)
                rate, cpu = await throughput(stream, args.streams, args.window, p.relay_pid)
        relay_cpu = f"{cpu:.1f}" if p.relay_pid else "-"
        print(f"{name:>8} {median_p99(unary):>17} {median_p99(first):>15} {rate:>12.0f}"
              f" {relay_cpu:>16}", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
