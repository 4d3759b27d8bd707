"""Benchmark: do the proxy's workers and the gateway's API processes scale with cores? Each
relaying process gets a simulated core of its own (a CPU quota, :mod:`bench.instruments.cgroups`),
the load generator and the upstream none, so the relay, not the machine, is the scarce resource.

Tables (``--cores 1,2,3,4``: N simulated cores; ``--core 0.1``: one is a tenth of a real core):

- **proxy**: hangup ``--workers N``, each worker in a cgroup of its own with one core's quota,
  side by side with Envoy ``--concurrency N`` in one cgroup with N cores' quota, relaying
  token-like SSE (``bench/instruments/sse_source.py``, one write per event) to ``--streams``
  streaming calls of ``--events`` events each, every call on a new connection (``--keep-alive``:
  each client loop's calls on one) (:mod:`bench.scaling.load`);
- **gateway**: hangup ``--api-processes N`` (``--workers N``, the simulated engine stepping every
  4 ms with no cost per sequence, so it is never the limit), each API process in a cgroup of
  its own, streaming completions of ``--events`` tokens.

Each table also has a row with no quota (the most processes, unconstrained): what the load
generator can drive. For every row: events/s and its ratio to one core's, relay CPU µs per event
(the quota'd processes; the supervisor's apart), and the checks that make a row valid:

- every quota'd process used at least 0.9 of its quota and was throttled in at least half the
  periods (the quota, not the shared machine, was its limit);
- no load-generating process (clients, sources) used more than 0.85 of a core;
- the unconstrained row relayed at least 1.15 times the row's events/s
  (:mod:`bench.scaling.report`).

An invalid row is reported, marked with why. The spread: how many calls the kernel gave each
process (``max/min``), from :mod:`bench.instruments.socket_owners`.

Run: ``.venv/bin/python -m bench.scaling.cores --out DIR`` (writes ``DIR/report.md`` and
``DIR/rows.json``; about 10 minutes with the defaults, 13 with ``--one-process``). On a machine
without a writable cgroup CPU controller it says so and exits 0 having measured nothing.
``--many-core`` picks defaults for a machine with 16 cores or more (see docs/benchmarks.md);
``--real-cores`` makes each simulated core a whole real one there (each relaying process pinned
to a physical core of its own, no quota, no unconstrained rows; for a machine whose cgroups
cannot be written or do not throttle, :class:`bench.instruments.cgroups.RealCores`).

This module measures the rows and tables and holds the command line; the relays are started and
given their quotas in :mod:`bench.scaling.relays`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.base.addresses import port_of
from bench.base.processes import REPO
from bench.instruments.cgroups import (
    PERIOD_US,
    Controller,
    CpuGroup,
    CpuStat,
    NoCpuController,
    RealCores,
    cpu_controller,
)
from bench.instruments.socket_owners import Owners
from bench.instruments.sse_source import sources
from bench.instruments.stats import cpu_of, syscalls
from bench.scaling.relays import Relay, gateways, proxies
from bench.scaling.report import HEADER, headroom, line, ratios, why_invalid, write_report


@dataclass
class Setup:
    """How a table loads its relays and measures each row."""

    kind: str  # scaling_load's --kind
    streams: int
    events: int
    window: float
    warmup: float
    clients: int
    attempts: int
    load_pids: list[int]  # the upstream's processes (the source), checked like the clients
    load_group: CpuGroup | None = None  # the load generator's (no quota), clients join it
    keep_alive: bool = False  # each client loop's calls on one connection


def _clients(setup: Setup, address: str, start: float, end: float) -> list[subprocess.Popen[str]]:
    share = [
        setup.streams // setup.clients + (i < setup.streams % setup.clients)
        for i in range(setup.clients)
    ]
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.scaling.load",
                "--address",
                address,
                "--kind",
                setup.kind,
                "--concurrency",
                str(n),
                "--events",
                str(setup.events),
                "--start",
                f"{start:.6f}",
                "--end",
                f"{end:.6f}",
                *(["--keep-alive"] if setup.keep_alive else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for n in share
        if n
    ]


@dataclass
class Snapshot:
    own: list[float]  # CPU seconds of each group
    stats: list[CpuStat]
    others: float
    load: list[float]  # CPU seconds of each upstream process
    io: tuple[int, int]  # the relay's read and write system calls

    @classmethod
    def take(cls, relay: Relay, setup: Setup) -> Snapshot:
        flat = [pid for pids in relay.groups for pid in pids]
        return cls(
            [cpu_of(pids) for pids in relay.groups],
            [group.stat() for group in relay.limits],
            cpu_of(relay.others),
            [cpu_of([pid]) for pid in setup.load_pids],
            syscalls(flat),
        )


async def measure(relay: Relay, setup: Setup) -> dict[str, object]:
    """One row: ``setup.window`` seconds of calls through ``relay``, and the checks."""
    start = time.monotonic() + setup.warmup
    end = start + setup.window
    clients = _clients(setup, relay.address, start, end)
    if setup.load_group is not None:
        for client in clients:
            setup.load_group.add(client.pid)
    port = port_of(relay.address)
    owners = Owners(port, [pids[0] for pids in relay.groups] if relay.spread else [])
    await asyncio.sleep(max(0.0, start - time.monotonic()))  # the agreed moment, not a wait
    before = Snapshot.take(relay, setup)
    await owners.run(end)
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    after = Snapshot.take(relay, setup)
    outputs = [json.loads((await asyncio.to_thread(c.communicate))[0]) for c in clients]
    events = sum(o["events"] for o in outputs)
    sleeps = sum(o["sleeps"] for o in outputs)
    ports = [p for o in outputs for p in o["ports"]]
    used = [(a - b) / setup.window for a, b in zip(after.own, before.own, strict=True)]
    stats = [a - b for a, b in zip(after.stats, before.stats, strict=True)]
    load = [o["cpu"] / setup.window for o in outputs]
    load += [(a - b) / setup.window for a, b in zip(after.load, before.load, strict=True)]
    per_pid, unseen = owners.count(ports) if relay.spread else ({}, 0)
    row: dict[str, object] = {
        "name": relay.label(),
        "kind": relay.name.split(" --")[0],
        "n": relay.threads * len(relay.groups),
        "cores": relay.cores,
        "rate": events / setup.window,
        "relay_us": 1e6 * sum(used) * setup.window / max(1, events),
        "others_us": 1e6 * (after.others - before.others) / max(1, events),
        "reads": (after.io[0] - before.io[0]) / max(1, events),
        "writes": (after.io[1] - before.io[1]) / max(1, events),
        "client_sleeps": sleeps / max(1, events),
        "used": used,
        "throttled": [s.throttled / s.periods for s in stats if s.periods],  # none: real cores
        "load": load,
        "calls": [per_pid[p] for p in sorted(per_pid)],
        "unseen": unseen,
    }
    row["why_invalid"] = why_invalid(row)
    return row


async def table(
    title: str, relays: list[Relay], setup: Setup, rounds: int
) -> list[dict[str, object]]:
    """Every relay measured ``rounds`` times, alternating (drift on a shared machine hits all);
    a row its own checks find invalid is measured again, up to ``setup.attempts`` times (every
    attempt is reported)."""
    rows = []
    for r in range(rounds):
        final = []
        for relay in relays:
            for attempt in range(1, setup.attempts + 1):
                row = await measure(relay, setup)
                row.update(table=title, round=r + 1, attempt=attempt, streams=setup.streams)
                if not row["why_invalid"] or attempt == setup.attempts:
                    final.append(row)
                    break
                row["x"] = None
                rows.append(row)
                print(line(row), flush=True)
        headroom(final)
        ratios(final)
        for row in final:
            print(line(row), flush=True)
        rows.extend(final)
    return rows


def _defaults(argv: list[str]) -> dict[str, object]:
    """The defaults: this 2-core machine's, or (``--many-core``) a machine with 16 cores or
    more's, where a simulated core can be bigger and the load generator needs more processes
    (and the simulated engine steps faster, so that 8 API processes do not outrun it)."""
    cpus = os.cpu_count() or 2
    if "--many-core" in argv:
        return dict(
            cores=[1, 2, 4, 8],
            core=0.25,
            window=4.0,
            warmup=1.5,
            attempts=1,
            clients=max(1, cpus // 3),
            sources=max(2, cpus // 4),
            sim_step=0.002,
        )
    return dict(
        cores=[1, 2, 3, 4],
        core=0.1,
        window=5.0,
        warmup=2.0,
        attempts=2,
        clients=max(1, cpus // 4),
        sources=max(2, cpus // 4),
        sim_step=0.004,
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda v: [int(c) for c in v.split(",")]  # noqa: E731
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for the report")
    add("--many-core", action="store_true", help="defaults for 16 cores or more (see _defaults)")
    add("--cores", type=ints, help="simulated cores per row: N processes (1,2,3,4)")
    add("--core", type=float, help="one simulated core, in real cores (0.1)")
    add("--streams", type=ints, default=[64, 256], help="concurrent calls, one table each")
    add("--events", type=int, default=400, help="per call")
    add("--window", type=float, help="seconds measured per row (5)")
    add("--warmup", type=float, help="seconds of calls before the window (2)")
    add("--rounds", type=int, default=2, help="alternating rounds per table")
    add("--attempts", type=int, help="measurements of a row while it is invalid (2)")
    add("--clients", type=int, help="load-generating processes (cores / 4)")
    add("--sources", type=int, help="SSE source processes (cores / 4, at least 2)")
    add(
        "--weight",
        type=int,
        default=8,
        help="CPU weight of the relays' and the load "
        "generator's groups, in default shares (1: none over the machine's other work)",
    )
    add(
        "--engine-workers",
        type=int,
        default=0,
        help="the gateway's simulated engine workers (0: one per API process)",
    )
    add("--sim-step", type=float, help="the simulated engine's step, seconds (0.004)")
    add("--period-us", type=int, default=PERIOD_US, help="the CFS period of every quota (100000)")
    add("--one-process", action="store_true", help="add rows of one process with N cores' quota")
    add("--keep-alive", action="store_true", help="each client loop's calls on one connection")
    add("--no-envoy", dest="envoy", action="store_false")
    add("--only", choices=["proxy", "gateway"], default=None)
    add("--real-cores", action="store_true", help="a whole pinned core per process, no quota")
    parser.set_defaults(**_defaults(sys.argv))
    return parser.parse_args()


@contextlib.contextmanager
def load_group(controller: Controller | RealCores, weight: int) -> Iterator[CpuGroup]:
    """The load generator's group: no quota, ``weight`` as the relays' (so that on a busy
    shared machine it keeps up with them); on real cores, the cores the relays do not use."""
    if isinstance(controller, RealCores):
        group: CpuGroup = controller.load()
    else:
        group = CpuGroup(controller, f"hangup-bench-{os.getpid()}-load", None, weight=weight)
    try:
        yield group
    finally:
        group.remove()


async def run_tables(
    args: argparse.Namespace, controller: Controller | RealCores
) -> list[dict[str, object]]:
    work = REPO / ".demo" / "bench-scaling"
    rows: list[dict[str, object]] = []
    print(HEADER, flush=True)
    with load_group(controller, args.weight) as load:
        for streams in args.streams:
            setup = Setup(
                "sse",
                streams,
                args.events,
                args.window,
                args.warmup,
                args.clients,
                args.attempts,
                [],
                load,
                args.keep_alive,
            )
            if args.only in (None, "proxy"):
                with sources(args.sources, work) as (upstream, pids):
                    for pid in pids:
                        load.add(pid)
                    setup.load_pids = pids
                    with proxies(args, controller, work, upstream) as relays:
                        rows += await table("proxy", relays, setup, args.rounds)
            if args.only in (None, "gateway"):
                setup.kind, setup.load_pids = "completions", []
                with gateways(args, controller, work) as relays:
                    rows += await table("gateway", relays, setup, args.rounds)
    return rows


async def main() -> None:
    args = _arguments()
    try:
        if args.real_cores:
            args.core = 1.0
            controller: Controller | RealCores = RealCores(max(args.cores))
        else:
            controller = cpu_controller()
    except NoCpuController as exc:
        print(f"bench.scaling.cores skipped: {exc}", flush=True)
        return
    print(f"{os.cpu_count()} cores; {controller.describe()}", flush=True)
    rows = await run_tables(args, controller)
    write_report(args, controller, rows)


if __name__ == "__main__":
    asyncio.run(main())
