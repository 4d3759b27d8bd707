"""The report of ``bench.scaling.cores``: the checks that make a row valid, ratios to one core, the
Markdown table."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.instruments.cgroups import Controller, RealCores

USED = 0.9  # of its quota a process must use for a row to count
THROTTLED = 0.5  # of the periods in which it must have been throttled
LOAD_MAX = 0.85  # of a core a load-generating process may use
HEADROOM = 1.15  # the unconstrained row's events/s over a valid row's, at least


def why_invalid(row: dict[str, object]) -> list[str]:
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


def ratios(rows: list[dict[str, object]]) -> None:
    """Each row's events/s over its kind's one-core row (hangup to hangup, Envoy to Envoy)."""
    ones: dict[object, float] = {}
    for row in rows:
        rate = row["rate"]
        assert isinstance(rate, float)
        if row["n"] == 1 and row["cores"] is not None and rate > 0:
            ones[row["kind"]] = rate
        one = ones.get(row["kind"])
        row["x"] = rate / one if one and row["cores"] is not None else None


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
        f"{row['others_us']:.2f} | {row['reads']:.2f} / {row['writes']:.2f} / "
        f"{row.get('client_sleeps', 0.0):.2f} | {share} | "
        f"{min(throttled, default=0):.2f} | "
        f"{max(load):.2f} | {spread} | {'; '.join(why) or 'valid'} |"
    )


def write_report(
    args: argparse.Namespace, controller: Controller | RealCores, rows: list[dict[str, object]]
) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    head = (
        f"# bench.scaling.cores\n\n{os.cpu_count()} cores; {controller.describe()}; one simulated "
        f"core = {args.core:g} of a real core; "
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


HEADER = (
    "| round.attempt | path | quota (cores per group) | events/s | x one core | relay µs/event | "
    "supervisor µs/event | relay reads / writes, client waits, per event | "
    "used of quota (min-max) | throttled periods (min) | "
    "load gen max core | calls per process (max/min) | row |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|"
)
