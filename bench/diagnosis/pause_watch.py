"""Diagnosis: does this whole machine stop now and then (the hypervisor pausing its CPUs), and
for how long?

A process that wakes every ``--tick`` seconds notes each wake that came later than
``--gap`` seconds, with the CPU time the hypervisor stole from the machine's CPUs meanwhile
(``steal`` in /proc/stat) and the tasks runnable then (/proc/loadavg). Run it beside a test run
with a higher priority than the run (``nice -n -5``: under Linux's fair scheduler a busy machine
then delays it by milliseconds, not seconds), so that a long gap means the machine itself did
not run, which a steal as long as the gap confirms; a gap without steal is this process
starved.

Run: ``nice -n -5 .venv/bin/python -m bench.diagnosis.pause_watch --for 3600 --out pauses.jsonl``;
one JSON line per late wake, and a summary line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _stolen() -> float:
    """Seconds of CPU time stolen from this machine's CPUs so far, summed over CPUs."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--for", dest="duration", type=float, default=3600.0, help="seconds")
    parser.add_argument("--tick", type=float, default=0.02)
    parser.add_argument("--gap", type=float, default=0.25, help="a wake this late is noted")
    parser.add_argument("--out", type=Path, default=Path("pauses.jsonl"))
    args = parser.parse_args()
    end = time.monotonic() + args.duration
    gaps: list[float] = []
    with args.out.open("a") as out:
        last, stolen = time.monotonic(), _stolen()
        while last < end:
            time.sleep(args.tick)
            now, now_stolen = time.monotonic(), _stolen()
            late = now - last - args.tick
            if late > args.gap:
                gaps.append(late)
                row = {
                    "at": time.strftime("%H:%M:%S"),
                    "late_s": round(late, 3),
                    "stolen_s": round(now_stolen - stolen, 3),
                    "loadavg": Path("/proc/loadavg").read_text().split()[:4],
                }
                out.write(json.dumps(row) + "\n")
                out.flush()
            last, stolen = now, now_stolen
        summary = {"late_wakes": len(gaps), "longest_s": round(max(gaps, default=0.0), 3),
                   "stolen_total_s": round(_stolen(), 2)}  # fmt: skip
        out.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
