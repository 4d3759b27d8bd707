"""Benchmark: gRPC cancel → engine abort, direct, through hangup's proxy, and through Envoy.

For each path (see ``bench.grpc.paths``): ``--background`` streams keep decoding; then, one at
a time, a ModelStreamInfer stream starts a long request, waits for its first response (the
request is decoding), and the client cancels the call (HTTP/2 ``RST_STREAM``). On one clock
(CLOCK_MONOTONIC, shared by the processes) it reports:

- ``to abort asked``: client cancel → the gateway asking the engine to abort (what the path
  between them costs: the relay's detection and cancel call, or the reset stream);
- ``to boundary``: client cancel → the engine's step boundary that applied the abort;
- ``to confirmed``: client cancel → the gateway holding the engine's confirmation;
- ``reason``: what the gateway recorded (``hangup_gateway_cancellations_total``).

Run: ``.venv/bin/python -m bench.grpc.cancel`` (``--cancels 50`` for a quicker run).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import grpc

from bench.base.processes import REPO
from bench.base.waiting import poll_until
from bench.grpc.paths import (
    PATHS,
    aborts,
    gateway_cancellations,
    path,
    stubs,
    text_request,
)
from bench.instruments.stats import median_p99

LONG = 4000  # tokens: 40 s at 10 ms a step


async def one_cancel(stream_stub: object, n: int) -> tuple[str, float]:
    """Start a long streamed request, cancel its call after the first response."""
    call = stream_stub(metadata=(("x-request-id", f"c{n}"),))  # type: ignore[operator]
    await call.write(text_request("r", "cancel me", LONG, stream=True))
    first = await call.read()
    assert not first.error_message, first.error_message
    call_id = dict(await call.initial_metadata())["x-request-id"]
    started = time.monotonic()
    call.cancel()
    return f"{call_id}-1", started


async def background(stream_stub: object, n: int, stop: asyncio.Event) -> None:
    call = stream_stub()  # type: ignore[operator]
    await call.write(text_request(f"bg{n}", "keep busy", LONG, stream=True))
    reader = asyncio.ensure_future(_drain(call))
    await stop.wait()
    call.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def _drain(call: object) -> None:
    async for _ in call:  # type: ignore[attr-defined]
        pass


async def run_path(target: str, cancels: int, n_background: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(target) as channel:
        _, stream = stubs(channel)
        stop = asyncio.Event()
        busy = [asyncio.create_task(background(stream, i, stop)) for i in range(n_background)]
        sent = dict([await one_cancel(stream, i) for i in range(cancels)])
        stop.set()
        await asyncio.gather(*busy, return_exceptions=True)
    return sent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--background", type=int, default=8)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-grpc"
    gateway_args = ["--sim-slots", "64", "--sim-step-base", "0.01", "--sim-step-per-seq", "0.0001"]
    print(f"{'path':>8} {'cancels':>8} {'ms p50/p99: to abort asked':>27} {'to boundary':>15}"
          f" {'to confirmed':>15}  reasons")  # fmt: skip
    for name in args.paths.split(","):
        with path(name, Path(work), gateway_args) as p:
            sent = await run_path(p.target, args.cancels, args.background)
            expected = args.cancels + args.background

            def arrived(url: str = p.gateway_http, n: int = expected) -> bool:
                return sum(gateway_cancellations(url).values()) >= n

            poll_until(arrived, 30.0, "every cancel to reach the gateway", interval=0.01)
            recorded = gateway_cancellations(p.gateway_http)
        seen = aborts(p.boundary_log)
        measured = [(seen[k], t) for k, t in sent.items() if k in seen]
        asked = [1000 * (a.requested - t) for a, t in measured]
        to_boundary = [1000 * (a.boundary - t) for a, t in measured]
        to_confirmed = [1000 * (a.confirmed - t) for a, t in measured if a.confirmed is not None]
        reasons = ", ".join(f"{r}={n:.0f}" for r, n in sorted(recorded.items()))
        print(f"{name:>8} {len(measured):>8} {median_p99(asked):>27} {median_p99(to_boundary):>15}"
              f" {median_p99(to_confirmed):>15}  {reasons}", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
