"""Summaries the benchmarks print."""

from __future__ import annotations

import contextlib
import json
import os
import select
import statistics
from collections.abc import Sequence
from pathlib import Path


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``values`` must not be empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median_p99(values: Sequence[float], digits: int = 2) -> str:
    """``median/p99`` of ``values``, each with ``digits`` decimals."""
    return f"{statistics.median(values):.{digits}f}/{quantile(values, 0.99):.{digits}f}"


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time a process has used so far (0 for no process)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: Sequence[int]) -> float:
    """:func:`cpu_seconds` summed over ``pids`` (a process that has exited counts 0)."""
    spent = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            spent += cpu_seconds(pid)
    return spent


def rss_mib(pid: int) -> float:
    """A process's resident memory now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def syscalls(pids: Sequence[int]) -> tuple[int, int]:
    """(read, write) system calls made so far by ``pids``, summed (``/proc/PID/io``: read,
    readv, recv... and write, writev, send...; a process that has exited counts 0)."""
    reads = writes = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines()
            )
            reads += int(fields["syscr"])
            writes += int(fields["syscw"])
    return reads, writes


def print_json_line(value: object) -> None:
    """Write ``value`` as one JSON line to stdout, whole, for the parent that reads it.

    ``print`` is not enough for a large line from a process that ran uvloop: there a write to a
    full pipe can return having written part of it, and with ``PYTHONUNBUFFERED`` (set in CI)
    the text layer drops the rest: a load's 600 KB of latencies reached its parent as the first
    64 KiB and a newline (the "line 2 column 1" parse errors of ``bench.short_calls.one_core``).
    This writes until every byte is out, waiting for the pipe when it is full."""
    view = memoryview((json.dumps(value) + "\n").encode())
    while view:
        try:
            written = os.write(1, view)
        except BlockingIOError:
            select.select([], [1], [])
            continue
        view = view[written:]
