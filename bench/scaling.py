"""Benchmark: do the proxy's workers and the gateway's API processes scale with cores? Each
relaying process gets a simulated core of its own (a CPU quota, :mod:`bench.cgroups`), the load
generator and the upstream none, so the relay, not the machine, is the scarce resource.

Tables (``--cores 1,2,3,4``: N simulated cores; ``--core 0.1``: one is a tenth of a real core):

- **proxy**: hangup ``--workers N``, each worker in a cgroup of its own with one core's quota,
  side by side with Envoy ``--concurrency N`` in one cgroup with N cores' quota, relaying
  token-like SSE (``bench/proxy_sse_source.py``, one write per event) to ``--streams`` streaming
  calls of ``--events`` events each, every call on a new connection (:mod:`bench.scaling_load`);
- **gateway**: hangup ``--api-processes N`` (``--workers N``, the simulated engine stepping every
  4 ms with no cost per sequence, so it is never the limit), each API process in a cgroup of
  its own, streaming completions of ``--events`` tokens.

Each table also has a row with no quota (the most processes, unconstrained): what the load
generator can drive. For every row: events/s and its ratio to one core's, relay CPU µs per event
(the quota'd processes; the supervisor's apart), and the checks that make a row valid:

- every quota'd process used at least ``USED`` of its quota and was throttled in at least
  ``THROTTLED`` of the periods (the quota, not the shared machine, was its limit);
- no load-generating process (clients, sources) used more than ``LOAD_MAX`` of a core;
- the unconstrained row relayed at least ``HEADROOM`` times the row's events/s.

An invalid row is reported, marked with why. The spread: how many calls the kernel gave each
process (``max/min``), from :mod:`bench.spread`.

Run: ``.venv/bin/python -m bench.scaling --out DIR`` (writes ``DIR/report.md`` and
``DIR/rows.json``; about 8 minutes with the defaults). On a machine without a writable cgroup
CPU controller it says so and exits 0 having measured nothing. ``--many-core`` picks defaults for
a machine with 16 cores or more (see docs/benchmarks.md).
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
from dataclasses import dataclass, field
from pathlib import Path

from bench.cgroups import Controller, CpuGroup, CpuStat, NoCpuController, cpu_controller
from bench.spread import Owners
from bench.stats import cpu_of, syscalls
from tests.support.envoy import envoy_binary, running_envoy
from tests.support.processes import REPO, Process, children, descendants, spawn

USED = 0.9  # of its quota a process must use for a row to count
THROTTLED = 0.5  # of the periods in which it must have been throttled
LOAD_MAX = 0.85  # of a core a load-generating process may use
HEADROOM = 1.15  # the unconstrained row's events/s over a valid row's, at least
SIM = [
    "--engine",
    "sim",
    "--sim-slots",
    "1024",
    "--sim-step-base",
    "0.004",
    "--sim-step-per-seq",
    "0",
    "--log-level",
    "WARNING",
]


@dataclass
class Relay:
    """One path under test: where to send calls, which processes relay (each list one cgroup)."""

    name: str
    address: str
    groups: list[list[int]]
    others: list[int] = field(default_factory=list)  # measured, never limited (a supervisor)
    cores: float | None = None  # per group (Envoy's one group: N times)
    spread: bool = True  # whether calls are attributed to processes
    threads: int = 1  # simulated cores per group (Envoy: its --concurrency)
    free: bool = False  # no quota: what the load generator can drive
    weight: int = 1  # CPU weight of its groups (see CpuGroup)
    limits: list[CpuGroup] = field(default_factory=list)


@dataclass
class Setup:
    controller: Controller
    kind: str  # scaling_load's --kind
    streams: int
    events: int
    window: float
    warmup: float
    clients: int
    attempts: int
    load_pids: list[int]  # the upstream's processes (the source), checked like the clients
    work: Path
    load_group: CpuGroup | None = None  # the load generator's (no quota), clients join it


def place(controller: Controller, relay: Relay, cores: float | None) -> None:
    """Give each of ``relay``'s process groups a cgroup with ``cores`` of quota."""
    relay.cores = cores
    for pids in relay.groups:
        name = f"hangup-bench-{os.getpid()}-{time.monotonic_ns()}"
        group = CpuGroup(controller, name, cores, weight=relay.weight)
        relay.limits.append(group)
        for pid in pids:
            group.add(pid)


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
                "bench.scaling_load",
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
    port = int(relay.address.rsplit(":", 1)[1])
    owners = Owners(port, [pids[0] for pids in relay.groups] if relay.spread else [])
    await asyncio.sleep(max(0.0, start - time.monotonic()))  # the agreed moment, not a wait
    before = Snapshot.take(relay, setup)
    await owners.run(end)
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    after = Snapshot.take(relay, setup)
    outputs = [json.loads((await asyncio.to_thread(c.communicate))[0]) for c in clients]
    events = sum(o["events"] for o in outputs)
    ports = [p for o in outputs for p in o["ports"]]
    used = [(a - b) / setup.window for a, b in zip(after.own, before.own, strict=True)]
    stats = [a - b for a, b in zip(after.stats, before.stats, strict=True)]
    load = [o["cpu"] / setup.window for o in outputs]
    load += [(a - b) / setup.window for a, b in zip(after.load, before.load, strict=True)]
    per_pid, unseen = owners.count(ports) if relay.spread else ({}, 0)
    row: dict[str, object] = {
        "name": relay.name + (", no quota" if relay.free else ""),
        "kind": relay.name.split(" --")[0],
        "cores": relay.cores,
        "rate": events / setup.window,
        "relay_us": 1e6 * sum(used) * setup.window / max(1, events),
        "others_us": 1e6 * (after.others - before.others) / max(1, events),
        "reads": (after.io[0] - before.io[0]) / max(1, events),
        "writes": (after.io[1] - before.io[1]) / max(1, events),
        "used": used,
        "throttled": [s.throttled / max(1, s.periods) for s in stats],
        "load": load,
        "calls": [per_pid[p] for p in sorted(per_pid)],
        "unseen": unseen,
    }
    row["why_invalid"] = _why_invalid(row)
    return row


def _why_invalid(row: dict[str, object]) -> list[str]:
    why = []
    cores = row["cores"]
    if isinstance(cores, float):
        used = row["used"]
        assert isinstance(used, list)
        low = [u / cores for u in used if u < USED * cores]
        if low:
            why.append(f"used {min(low):.2f} of its quota")
        throttled = row["throttled"]
        assert isinstance(throttled, list)
        if min(throttled, default=1.0) < THROTTLED:
            why.append(f"throttled in {min(throttled):.2f} of periods")
    load = row["load"]
    assert isinstance(load, list)
    if max(load) > LOAD_MAX:
        why.append(f"load generator at {max(load):.2f} core")
    return why


def headroom(rows: list[dict[str, object]]) -> None:
    """Mark the rows their kind's unconstrained row did not beat by ``HEADROOM``."""
    limits = {row["kind"]: row["rate"] for row in rows if row["cores"] is None}
    for row in rows:
        rate, limit = row["rate"], limits.get(row["kind"])
        assert isinstance(rate, float)
        if row["cores"] is not None and isinstance(limit, float) and limit < HEADROOM * rate:
            why = row["why_invalid"]
            assert isinstance(why, list)
            why.append(f"unconstrained only {limit / max(rate, 1):.2f}x")


def _pids(process: Process) -> tuple[list[list[int]], list[int]]:
    """(each serving process with its descendants, the supervisor) of a server we started:
    with one process it serves itself; with more, its children serve."""
    top = process.popen.pid
    kids = children(top)
    if not kids:
        return [[top]], []
    return [[kid, *descendants(kid)] for kid in sorted(kids)], [top]


@contextlib.contextmanager
def sources(count: int, work: Path) -> Iterator[tuple[str, list[int]]]:
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(
            spawn("bench.proxy_sse_source", ["--port", "0", "--reuse-port"], work / "source-0")
        )
        port = first.listeners["http"].rsplit(":", 1)[1]
        pids = [first.popen.pid]
        for i in range(1, count):
            more = stack.enter_context(
                spawn(
                    "bench.proxy_sse_source", ["--port", port, "--reuse-port"], work / f"source-{i}"
                )
            )
            pids.append(more.popen.pid)
        yield first.listeners["http"], pids


def _proxy(stack: contextlib.ExitStack, n: int, upstream: str, work: Path) -> Relay:
    flags = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--log-level",
             "WARNING", "--upstream-http", f"http://{upstream}", "--max-concurrent-streams", "0",
             "--workers", str(n)]  # fmt: skip
    proc = stack.enter_context(spawn("proxy", flags, work / f"hangup-{n}-{time.monotonic_ns()}"))
    groups, others = _pids(proc)
    return Relay(f"hangup --workers {n}", proc.listeners["http"], groups, others)


def _envoy(stack: contextlib.ExitStack, n: int, upstream: str, work: Path, serial: int) -> Relay:
    port = int(upstream.rsplit(":", 1)[1])
    envoy = stack.enter_context(
        running_envoy(port, work / f"envoy-{n}-{serial}", concurrency=n, base_id=port + serial)
    )
    return Relay(
        f"envoy --concurrency {n}", envoy.address, [[envoy.popen.pid]], spread=False, threads=n
    )


@contextlib.contextmanager
def proxies(args: argparse.Namespace, setup: Setup, upstream: str) -> Iterator[list[Relay]]:
    """hangup --workers N and Envoy --concurrency N for every N, quota'd, then each with the
    most N and no quota."""
    top = max(args.cores)
    with contextlib.ExitStack() as stack:
        relays = [_proxy(stack, n, upstream, setup.work) for n in args.cores]
        relays.append(_proxy(stack, top, upstream, setup.work))
        relays[-1].free = True
        if args.envoy and envoy_binary().exists():
            relays += [_envoy(stack, n, upstream, setup.work, i)
                       for i, n in enumerate([*args.cores, top])]  # fmt: skip
            relays[-1].free = True
        elif args.envoy:
            print(f"no Envoy at {envoy_binary()}: Envoy rows skipped", flush=True)
        with _limited(setup.controller, relays, args.core, args.weight):
            yield relays


def _gateway(stack: contextlib.ExitStack, n: int, workers: int, work: Path) -> Relay:
    argv = [*SIM, "--http-port", "0", "--grpc-port", "0", "--workers", str(workers or n),
            "--api-processes", str(n)]  # fmt: skip
    proc = stack.enter_context(
        spawn("gateway_server", argv, work / f"gateway-{n}-{time.monotonic_ns()}")
    )
    groups, others = _pids(proc)
    return Relay(f"hangup --api-processes {n}", proc.listeners["http"], groups, others)


@contextlib.contextmanager
def gateways(args: argparse.Namespace, setup: Setup) -> Iterator[list[Relay]]:
    with contextlib.ExitStack() as stack:
        relays = [
            _gateway(stack, n, args.engine_workers, setup.work)
            for n in [*args.cores, max(args.cores)]
        ]
        relays[-1].free = True
        with _limited(setup.controller, relays, args.core, args.weight):
            yield relays


@contextlib.contextmanager
def _limited(
    controller: Controller, relays: list[Relay], core: float, weight: int
) -> Iterator[None]:
    """A quota for every relay's group but the free ones' (in groups too: their throttling is
    read the same way); groups removed on the way out."""
    try:
        for relay in relays:
            relay.weight = weight
            place(controller, relay, None if relay.free else core * relay.threads)
        yield
    finally:
        for relay in relays:
            for group in relay.limits:
                group.remove()


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
        _ratios(final)
        for row in final:
            print(line(row), flush=True)
        rows.extend(final)
    return rows


def _ratios(rows: list[dict[str, object]]) -> None:
    """Each row's events/s over its kind's one-core row (hangup to hangup, Envoy to Envoy)."""
    ones: dict[str, float] = {}
    for row in rows:
        name = str(row["name"])
        kind, n = name.split(" --")[0], int(name.split(",")[0].rsplit(" ", 1)[1])
        rate = row["rate"]
        assert isinstance(rate, float)
        if n == 1 and "no quota" not in name and rate > 0:
            ones[kind] = rate
        row["n"] = n
        row["x"] = rate / ones[kind] if kind in ones and "no quota" not in name else None


def line(row: dict[str, object]) -> str:
    """One row as a Markdown table line (see :data:`HEADER`)."""
    used, throttled, cores = row["used"], row["throttled"], row["cores"]
    assert isinstance(used, list) and isinstance(throttled, list)
    quota = f"{cores:g}" if isinstance(cores, float) else "none"
    share = (
        f"{min(used) / cores:.2f}-{max(used) / cores:.2f}"
        if isinstance(cores, float)
        else f"{min(used):.2f}-{max(used):.2f} core"
    )
    calls = row["calls"]
    assert isinstance(calls, list)
    spread = (
        f"{'/'.join(map(str, calls))} ({max(calls) / max(1, min(calls)):.2f})"
        if len(calls) > 1
        else ""
    )
    x = row.get("x")
    why = row["why_invalid"]
    assert isinstance(why, list)
    load = row["load"]
    assert isinstance(load, list)
    return (
        f"| {row['round']}.{row['attempt']} | {row['name']} | {quota} | {row['rate']:,.0f} | "
        f"{'' if x is None else f'{x:.2f}x'} | {row['relay_us']:.1f} | "
        f"{row['others_us']:.2f} | {row['reads']:.2f} / {row['writes']:.2f} | {share} | "
        f"{min(throttled, default=0):.2f} | "
        f"{max(load):.2f} | {spread} | {'; '.join(why) or 'valid'} |"
    )


HEADER = (
    "| round.attempt | path | quota (cores per group) | events/s | x one core | relay µs/event | "
    "supervisor µs/event | relay reads / writes per event | used of quota (min-max) | "
    "throttled periods (min) | "
    "load gen max core | calls per process (max/min) | row |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|"
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    many = "--many-core" in sys.argv
    cpus = os.cpu_count() or 2
    parser.add_argument("--out", type=Path, required=True, help="folder for the report")
    parser.add_argument(
        "--many-core",
        action="store_true",
        help="defaults for 16 cores or more: --cores 1,2,4,8 --core 0.5",
    )
    parser.add_argument(
        "--cores",
        type=lambda v: [int(c) for c in v.split(",")],
        default=[1, 2, 4, 8] if many else [1, 2, 3, 4],
    )
    parser.add_argument(
        "--core", type=float, default=0.5 if many else 0.1, help="one simulated core, in real cores"
    )
    parser.add_argument(
        "--streams", type=lambda v: [int(c) for c in v.split(",")], default=[64, 256]
    )
    parser.add_argument("--events", type=int, default=400, help="per call")
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per row")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attempts", type=int, default=2, help="per row, while invalid")
    parser.add_argument("--clients", type=int, default=max(1, cpus // 4))
    parser.add_argument("--sources", type=int, default=max(2, cpus // 4))
    parser.add_argument(
        "--weight",
        type=int,
        default=8,
        help="CPU weight of the relays' and the load generator's groups, in "
        "default shares (1: no priority over the machine's other work)",
    )
    parser.add_argument(
        "--engine-workers",
        type=int,
        default=0,
        help="the gateway's simulated engine workers (0: one per API process)",
    )
    parser.add_argument("--no-envoy", dest="envoy", action="store_false")
    parser.add_argument("--only", choices=["proxy", "gateway"], default=None)
    return parser.parse_args()


@contextlib.contextmanager
def load_group(controller: Controller, weight: int) -> Iterator[CpuGroup]:
    """The load generator's group: no quota, ``weight`` as the relays' (so that on a busy
    shared machine it keeps up with them)."""
    group = CpuGroup(controller, f"hangup-bench-{os.getpid()}-load", None, weight=weight)
    try:
        yield group
    finally:
        group.remove()


async def run_tables(args: argparse.Namespace, controller: Controller) -> list[dict[str, object]]:
    work = REPO / ".demo" / "bench-scaling"
    rows: list[dict[str, object]] = []
    print(HEADER, flush=True)
    with load_group(controller, args.weight) as load:
        for streams in args.streams:
            setup = Setup(
                controller,
                "sse",
                streams,
                args.events,
                args.window,
                args.warmup,
                args.clients,
                args.attempts,
                [],
                work,
                load,
            )
            if args.only in (None, "proxy"):
                with sources(args.sources, work) as (upstream, pids):
                    for pid in pids:
                        load.add(pid)
                    setup.load_pids = pids
                    with proxies(args, setup, upstream) as relays:
                        rows += await table("proxy", relays, setup, args.rounds)
            if args.only in (None, "gateway"):
                setup.kind, setup.load_pids = "completions", []
                with gateways(args, setup) as relays:
                    rows += await table("gateway", relays, setup, args.rounds)
    return rows


def write_report(
    args: argparse.Namespace, controller: Controller, rows: list[dict[str, object]]
) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    head = (
        f"# bench.scaling\n\n{os.cpu_count()} cores; cgroup v{controller.version} at "
        f"{controller.root}; one simulated core = {args.core:g} of a real core; "
        f"{args.events} events per call, a new connection per call; {args.window:g} s per "
        f"row after {args.warmup:g} s; {args.clients} client process(es), {args.sources} "
        f"source process(es)\n\ncommand: `{' '.join(sys.argv)}`\n"
    )
    parts = [head]
    for title in ("proxy", "gateway"):
        for streams in args.streams:
            mine = [r for r in rows if r["table"] == title and r["streams"] == streams]
            if mine:
                parts.append(
                    f"\n## {title}, {streams} streams\n\n{HEADER}\n"
                    + "\n".join(line(r) for r in mine)
                    + "\n"
                )
    (args.out / "report.md").write_text("".join(parts))
    print(f"\nreport: {args.out / 'report.md'}", flush=True)


async def main() -> None:
    args = _arguments()
    try:
        controller = cpu_controller()
    except NoCpuController as exc:
        print(f"bench.scaling skipped: {exc}", flush=True)
        return
    print(f"{os.cpu_count()} cores; cgroup v{controller.version} at {controller.root}", flush=True)
    rows = await run_tables(args, controller)
    write_report(args, controller, rows)


if __name__ == "__main__":
    asyncio.run(main())
