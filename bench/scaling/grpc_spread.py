"""Benchmark: gRPC streams through the proxy into a gateway's API processes, on the shared gRPC
port against each process's own port (``--grpc-process-ports``), in one run.

The proxy keeps one HTTP/2 connection to an upstream address, so through the shared port (the
processes bind it with ``SO_REUSEPORT``) every call reaches the process that accepted that one
connection; given every process's own port, it connects to each and spreads its calls over them.
Each gateway process has ``--core`` of a real core (a CPU quota, :mod:`bench.instruments.cgroups`);
the proxy (``--workers 1``) and the load (this process: ``--streams`` ModelStreamInfer streams of
400 tokens, each followed by the next) have none. Rows, alternating each round:

- **one process**: a one-process gateway, the baseline;
- **shared port**: ``--api-processes N``, the proxy given the shared port;
- **own ports**: the same with ``--grpc-process-ports 0``, the proxy given every process's port.

Per row: responses/s over ``--window`` seconds, x the one-process row of the round, the serving
processes' CPU µs per response, and each process's share of a core in the window.

Run as root where cgroup CPU quotas can be written (elsewhere it says so and exits 0):
``.venv/bin/python -m bench.scaling.grpc_spread`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

import grpc

from bench.base.processes import REPO, spawn
from bench.grpc.paths import stubs, text_request
from bench.instruments.cgroups import CpuGroup, NoCpuController, cpu_controller
from bench.instruments.stats import cpu_seconds
from bench.scaling.relays import SIM, _pids


class Row:
    def __init__(self, name: str, target: str, serving: list[int]) -> None:
        self.name, self.target, self.serving = name, target, serving


def _row(stack: contextlib.ExitStack, name: str, processes: int, own_ports: bool,
         args: argparse.Namespace, controller: Any) -> Row:  # fmt: skip
    work = REPO / ".demo" / "bench-grpc-spread" / f"{time.monotonic_ns()}"
    argv = [*SIM, "--sim-step-base", str(args.sim_step), "--http-port", "0", "--grpc-port", "0",
            "--workers", str(processes), "--api-processes", str(processes),
            *(["--grpc-process-ports", "0"] if own_ports else [])]  # fmt: skip
    gateway = stack.enter_context(spawn("gateway_server", argv, work / "gateway"))
    groups, _ = _pids(gateway)
    for pids in groups:
        group = CpuGroup(controller, f"hangup-grpc-spread-{pids[0]}", args.core, weight=4)
        stack.callback(group.remove)
        for pid in pids:
            group.add(pid)
    upstream = gateway.listeners["grpc_processes" if own_ports else "grpc"]
    flags = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--log-level",
             "WARNING", "--upstream-http", gateway.url("http"), "--upstream-grpc", upstream,
             "--max-concurrent-streams", "0"]  # fmt: skip
    proxy = stack.enter_context(spawn("proxy", flags, work / "proxy"))
    return Row(name, proxy.listeners["grpc"], [pids[0] for pids in groups])


async def _window(row: Row, streams: int, window: float) -> tuple[int, list[float]]:
    """Responses received in ``window`` s, and each serving process's CPU seconds meanwhile."""
    counting = False
    received = 0

    async def loop(index: int, stream: Any) -> None:
        nonlocal received
        n = 0
        while True:
            call = stream()
            await call.write(text_request(f"g{index}-{n}-{time.monotonic_ns()}", "go", 400, True))
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                received += counting
            n += 1

    async with grpc.aio.insecure_channel(row.target) as channel:
        _, stream = stubs(channel)
        tasks = [asyncio.create_task(loop(i, stream)) for i in range(streams)]
        await asyncio.sleep(2.0)  # warm-up: every stream running
        before = [cpu_seconds(pid) for pid in row.serving]
        counting = True
        await asyncio.sleep(window)  # the measurement window itself
        counting = False
        spent = [cpu_seconds(pid) - b for pid, b in zip(row.serving, before, strict=True)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return received, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--core", type=float, default=0.1, help="each process's CPU quota")
    parser.add_argument("--sim-step", type=float, default=0.001)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    try:
        controller = cpu_controller()
    except NoCpuController as exc:
        print(f"not measured: {exc}")
        return
    print(controller.describe(), flush=True)
    n = args.processes
    with contextlib.ExitStack() as stack:
        rows = [
            _row(stack, "one process", 1, False, args, controller),
            _row(stack, f"{n} API processes, shared port", n, False, args, controller),
            _row(stack, f"{n} API processes, own ports", n, True, args, controller),
        ]
        for _ in range(args.rounds):
            one = None
            for row in rows:
                received, spent = asyncio.run(_window(row, args.streams, args.window))
                rate = received / args.window
                one = one or rate
                per_response = 1e6 * sum(spent) / max(1, received)
                shares = ", ".join(f"{s / args.window:.2f}" for s in spent)
                print(json.dumps({"row": row.name, "responses_per_s": round(rate),
                                  "x_one": round(rate / one, 2),
                                  "cpu_us_per_response": round(per_response, 1),
                                  "core_share_per_process": shares}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
