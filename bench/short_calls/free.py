"""Benchmark: the proxy's CPU per short call with no CPU quota, to compare two trees quickly.

The calls of ``bench.short_calls.one_core`` (1 KiB JSON in and out, an upstream that answers at
once) through hangup's proxy (``--workers 1``, no quota, no Envoy), kept-alive then new connection
per call, ``--rounds`` times: calls/s, the proxy's CPU µs per call and errors, one line each. No
cgroup is needed, so it runs anywhere; run it from the root of each tree to compare (the tree in
the working directory is the one imported). Figures on a shared machine move between runs:
alternate the trees and compare within a run.

Run: ``.venv/bin/python -m bench.short_calls.free`` (about 25 s with the defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.base.processes import REPO
from bench.instruments.sse_source import sources
from bench.instruments.stats import cpu_of
from bench.scaling.relays import proxy_relay


def window(
    address: str,
    keep: bool,
    loops: int,
    seconds: float,
    pids: list[int],
    warmup: float = 1.0,
    path: str = "/infer",
    rate: float = 0.0,
) -> tuple[dict[str, object], float]:
    """One window of ``seconds`` of calls to ``path`` at ``address`` from ``loops`` client loops
    (as fast as answers come, or ``rate`` calls a second in all), after ``warmup`` seconds of
    them: the load's output, and ``pids``' CPU seconds in the window (the benchmarks without a
    quota share it)."""
    start = time.monotonic() + warmup
    end = start + seconds
    argv = [sys.executable, "-m", "bench.short_calls.load", "--address", address, "--path",
            path, "--concurrency", str(loops), "--start", f"{start:.6f}", "--end",
            f"{end:.6f}", "--rate", str(rate)]  # fmt: skip
    if keep:
        argv.append("--keep-alive")
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    time.sleep(max(0.0, start - time.monotonic()))
    before = cpu_of(pids)
    time.sleep(max(0.0, end - time.monotonic()))
    cpu = cpu_of(pids) - before
    return dict(json.loads(load.communicate()[0])), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per row")
    parser.add_argument("--concurrency", type=int, default=16, help="client loops")
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-short-calls-free"
    with contextlib.ExitStack() as stack:
        upstream, _ = stack.enter_context(sources(1, work))
        relay = proxy_relay(stack, 1, upstream, work)
        pids = [pid for group in relay.groups for pid in group]
        for _ in range(args.rounds):
            for keep in (True, False):
                output, cpu = window(relay.address, keep, args.concurrency, args.window, pids)
                calls = int(str(output["calls"]))
                print(
                    f"{'kept-alive' if keep else 'new connection'}: "
                    f"{calls / args.window:,.0f} calls/s, {1e6 * cpu / max(1, calls):.0f} µs "
                    f"of proxy CPU per call, {output['errors']} errors",
                    flush=True,
                )


if __name__ == "__main__":
    main()
