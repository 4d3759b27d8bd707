"""Benchmark: what running as one of several API processes costs the gateway per event.

``bench.scaling.cores`` found four API processes at 64 streams well short of four times one process
(3.04x). This separates the suspects, each gateway process with the same CPU quota (``--core``
of a real core, :mod:`bench.instruments.cgroups`; the simulated engine stepping every
``--sim-step``), streaming completions of 400 tokens through ``bench.scaling.load``, in one run:

- **one**: one gateway process (``--api-processes 1``) with ``--streams`` streams;
- **independent**: ``--processes`` such gateways side by side, each with its own load of
  ``--streams`` streams (the machine as loaded as below, nothing shared between them);
- **independent, one load**: the same gateways loaded by one load process over all of them, as
  the API processes' row is (how many servers a client feeds moves a server's CPU per event);
- **API processes**: one gateway with ``--api-processes N`` (N = ``--processes``) and N times the
  streams (the shared listener, the sibling channel, metrics in prometheus_client's multiprocess
  files).

Prints events/s and the serving processes' CPU µs per event (supervisors apart), a line per row
and round. Run as root where cgroup CPU quotas can be written:
``.venv/bin/python -m bench.scaling.api_process_cost`` (about two minutes); elsewhere it says so and
exits 0. ``--real-cores`` (a machine with more cores than the processes and their load): each
serving process pinned to a physical core of its own instead of a quota, the load generators
on the other cores (:class:`bench.instruments.cgroups.RealCores`). ``--no-quota``: no quota and no
pinning, every process sharing the machine (with ``--sim-step 0`` each is busy all the time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

from bench.base.processes import REPO, spawn
from bench.instruments.cgroups import (
    Controller,
    CpuGroup,
    NoCpuController,
    RealCores,
    cpu_controller,
)
from bench.instruments.stats import cpu_of
from bench.scaling.relays import SIM, _pids


def _gateway(
    stack: contextlib.ExitStack,
    controller: Controller | RealCores | None,
    processes: int,
    args: argparse.Namespace,
    first: int = 0,
) -> tuple[str, list[int]]:
    """A gateway with ``processes`` API processes, each serving process in a quota'd group
    (real cores: on the ``first``-th core and on): (its address, the serving processes)."""
    argv = [*SIM, "--sim-step-base", str(args.sim_step), "--http-port", "0", "--grpc-port", "0",
            "--workers", str(processes), "--api-processes", str(processes)]  # fmt: skip
    work = REPO / ".demo" / "bench-api-process-cost" / f"gateway-{time.monotonic_ns()}"
    proc = stack.enter_context(spawn("gateway_server", argv, work))
    groups, _ = _pids(proc)
    for i, pids in enumerate(groups):
        if controller is None:
            continue
        if isinstance(controller, RealCores):
            group: CpuGroup = controller.group(first + i)
        else:
            group = CpuGroup(controller, f"hangup-apc-{os.getpid()}-{pids[0]}", args.core, weight=4)
        stack.callback(group.remove)
        for pid in pids:
            group.add(pid)
    return proc.listeners["http"], [pid for pids in groups for pid in pids]


def _window(loads: list[tuple[str, int]], pids: list[int], window: float) -> tuple[int, float]:
    """Events streamed to the ``loads`` (address, streams) in ``window`` s, and ``pids``' CPU."""
    start = time.monotonic() + 2.0
    end = start + window

    def load(address: str, streams: int) -> list[str]:
        return [sys.executable, "-m", "bench.scaling.load", "--address", address, "--kind",
                "completions", "--concurrency", str(streams), "--events", "400",
                "--start", f"{start:.6f}", "--end", f"{end:.6f}"]  # fmt: skip

    clients = [
        subprocess.Popen(load(address, streams), stdout=subprocess.PIPE, text=True, cwd=REPO)
        for address, streams in loads
    ]
    time.sleep(max(0.0, start - time.monotonic()))
    before = cpu_of(pids)
    time.sleep(max(0.0, end - time.monotonic()))
    cpu = cpu_of(pids) - before
    events = sum(int(json.loads(c.communicate()[0])["events"]) for c in clients)
    return events, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--streams", type=int, default=16, help="per process")
    parser.add_argument("--core", type=float, default=0.1, help="each process's CPU quota")
    parser.add_argument("--sim-step", type=float, default=0.001)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--real-cores", action="store_true", help="a pinned core each, no quota")
    parser.add_argument("--no-quota", action="store_true", help="no quota, no pinning")
    args = parser.parse_args()
    controller: Controller | RealCores | None = None
    try:
        if args.no_quota:
            pass
        elif args.real_cores:
            cores = RealCores(args.processes)
            os.sched_setaffinity(0, cores.load_cpus)  # the load generators start from here
            controller = cores
        else:
            controller = cpu_controller()
    except NoCpuController as exc:
        print(f"not measured: {exc}")
        return
    print(
        controller.describe() if controller else "no quota: the processes share the machine",
        flush=True,
    )
    n, s = args.processes, args.streams
    with contextlib.ExitStack() as stack:
        one = _gateway(stack, controller, 1, args)
        independent = [_gateway(stack, controller, 1, args, i) for i in range(n)]
        shared = _gateway(stack, controller, n, args)
        rows = [
            (f"one process, {s} streams", [(one[0], s)], one[1]),
            (f"{n} independent gateways, {s} streams each",
             [(address, s) for address, _ in independent],
             [pid for _, pids in independent for pid in pids]),
            (f"{n} independent gateways, one load over all, {n * s} streams",
             [(",".join(address for address, _ in independent), n * s)],
             [pid for _, pids in independent for pid in pids]),
            (f"{n} API processes, {n * s} streams", [(shared[0], n * s)], shared[1]),
        ]  # fmt: skip
        for _ in range(args.rounds):
            for name, loads, pids in rows:
                events, cpu = _window(loads, pids, args.window)
                per_event = 1e6 * cpu / max(1, events)
                print(f"{name}: {events / args.window:,.0f} events/s, "
                      f"{per_event:.1f} µs of CPU per event, "
                      f"{cpu / args.window:.2f} cores busy", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
