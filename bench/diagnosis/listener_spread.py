"""Diagnosis: how the shared listener spreads open connections over the processes of a server.

Every proxy (``--workers``) and gateway (``--api-processes``) whose processes share one HTTP
listening socket keeps a board of each process's open connections
(:class:`hangup_contract.runtime.shared_listener.Board`, in its supervisor's temporary
directory). This reads every such board it finds every ``--tick`` seconds for ``--for`` seconds
and, over the samples with at least ``--min-open`` connections open in all (a load running),
prints what each process held: the percentiles of one process's count, and of the largest over
the smallest count within a sample. Run it beside a benchmark, in the benchmark's session:

``.venv/bin/python -m bench.diagnosis.listener_spread --for 600 & .venv/bin/python -m
bench.scaling.api_process_cost --no-quota --sim-step 0 --rounds 1; kill %1`` (SIGTERM ends
the sampling and prints what it saw).
"""

from __future__ import annotations

import argparse
import glob
import signal
import statistics
import time
from pathlib import Path

from hangup_contract.runtime.shared_listener import Board

BOARDS = "/tmp/hangup-*/http-listener.board"


def _read(path: str) -> list[int] | None:
    """The open connections of each live process on the board at ``path``; None once it is gone."""
    try:
        board = Board(Path(path), Path(path).stat().st_size // 16)
    except (OSError, ValueError):
        return None
    try:
        counts, _ = board.read()
    finally:
        board.close()
    return [n for n in counts if n >= 0]


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return " / ".join(f"{v:g}" for v in values) or "none"
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    low, high = min(values), max(values)
    return f"min {low:g}, p5 {cuts[0]:g}, p50 {cuts[9]:g}, p95 {cuts[18]:g}, max {high:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--for", dest="duration", type=float, default=60.0, help="seconds")
    parser.add_argument("--tick", type=float, default=0.25)
    parser.add_argument("--min-open", type=int, default=32, help="a sample counts from this many")
    parser.add_argument("--boards", default=BOARDS, help="a glob of board files")
    args = parser.parse_args()
    held: list[float] = []
    spreads: list[float] = []
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    end = time.monotonic() + args.duration
    while time.monotonic() < end and not stopped:
        for path in glob.glob(args.boards):
            counts = _read(path)
            if not counts or len(counts) < 2 or sum(counts) < args.min_open:
                continue
            held.extend(counts)
            spreads.append(max(counts) / max(min(counts), 1))
        time.sleep(args.tick)
    print(f"{len(spreads)} samples with {args.min_open} or more connections open")
    print(f"one process's open connections: {_percentiles(held)}")
    print(f"largest / smallest within a sample: {_percentiles(spreads)}")


if __name__ == "__main__":
    main()
