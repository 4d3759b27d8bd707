"""Benchmark: the chaos soak's long run (``bench/harness/chaos.py``; a short run is in ``make
test``). Phases of mixed traffic through the proxy, half the clients hanging up, cycle through
every fault until ``--calls`` calls have been made; each phase settles and is checked (zombies,
byte-identical completions, false stream ends, cancels pending or uncounted, memory and open
files). Prints one line per phase and the totals.

Run: ``.venv/bin/python -m bench.robustness.chaos_soak`` (``--calls 200000``); with the real engine:
``.venv/bin/python -m bench.robustness.chaos_soak --engine vllm --calls 5000`` (a one-worker vLLM
gateway on the tiny local model, made in a temporary directory; its faults are
``chaos.VLLM_FAULTS``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.harness import chaos, chaos_report, chaos_traffic
from bench.harness.faults import Pod
from bench.harness.vllm_stack import START_TIMEOUT_S, make_tiny_model


def gateway_args(args: argparse.Namespace, tmp: Path) -> list[str]:
    if args.engine == "vllm":
        return chaos.vllm_gateway_args(str(make_tiny_model(tmp / "tiny-model")))
    return ["--sim-slots", str(args.sim_slots), "--sim-step-base", str(args.sim_step_base),
            "--sim-faults"]  # fmt: skip


async def soak(args: argparse.Namespace, tmp: Path) -> list[chaos_report.PhaseReport]:
    proxy_args = chaos.PROXY_ARGS
    rng = random.Random(args.seed)
    reports: list[chaos_report.PhaseReport] = []
    calls = 0
    faults = chaos.VLLM_FAULTS if args.engine == "vllm" else chaos.FAULTS
    start_s = START_TIMEOUT_S if args.engine == "vllm" else 60.0
    async with (
        Pod(tmp, gateway_args(args, tmp), proxy_args, args.engine, start_s) as pod,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        expected = await chaos_traffic.references(pod, session)
        while calls < args.calls:
            fault = faults[len(reports) % len(faults)]
            report = await chaos.run_phase(pod, session, expected, fault,
                                           seconds=args.phase_seconds,
                                           concurrency=args.concurrency, rng=rng)  # fmt: skip
            reports.append(report)
            calls += sum(report.calls.values())
            print(f"[{calls:>7}] {chaos_report.summary(report)}", flush=True)
            for finding in report.findings[:5]:
                print(f"          finding: {finding}", flush=True)
    return reports


def totals(reports: list[chaos_report.PhaseReport], took: float) -> None:
    calls = collections.Counter[str]()
    for report in reports:
        calls.update(report.calls)
    count = sum(calls.values())
    complete = sum(n for k, n in calls.items() if k.endswith("complete"))
    hung_up = sum(n for k, n in calls.items() if "hang-up" in k)
    faults = collections.Counter(r.fault for r in reports if r.fault != "none")
    print(f"\n{count} calls in {took / 60:.1f} min ({count / took:.0f}/s): {complete} complete"
          f" (each byte-identical to the direct call), {hung_up} hung up,"
          f" {count - complete - hung_up} failed by the faults")  # fmt: skip
    print("faults: " + ", ".join(f"{name} x{n}" for name, n in sorted(faults.items())))
    gave_up = {r.incarnations["proxy"]: r.gave_up for r in reports}  # each proxy's last count
    print(f"zombies: {sum(len(r.zombies) for r in reports)}; findings:"
          f" {sum(len(r.findings) for r in reports)}; cancels given up on (each counted and"
          f" logged): {sum(gave_up.values()):g}")  # fmt: skip
    for name in ("gateway", "proxy"):
        rss, files = chaos_report.growth(reports, name)
        seen = [r.resources[name] for r in reports if name in r.resources]
        low, high = min(s[0] for s in seen) // 1024, max(s[0] for s in seen) // 1024
        fewest, most = min(s[1] for s in seen), max(s[1] for s in seen)
        print(f"{name}: resident {low}-{high} MiB, open files {fewest}-{most} over the settles;"
              f" most growth within one process: {rss // 1024} MiB, {files} files")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--phase-seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=None, help="48 (sim), 8 (vllm)")
    parser.add_argument("--engine", choices=["sim", "vllm"], default="sim")
    parser.add_argument("--sim-slots", type=int, default=32)
    parser.add_argument("--sim-step-base", type=float, default=0.004)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.concurrency is None:
        args.concurrency = 8 if args.engine == "vllm" else 48
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hangup-chaos-") as tmp:
        reports = asyncio.run(soak(args, Path(tmp)))
    totals(reports, time.monotonic() - started)


if __name__ == "__main__":
    main()
