"""The processes an engine started, found and ended through ``/proc`` (Linux).

A vLLM engine core is a child of the gateway process, in the gateway's process group, and may
start processes of its own (tensor-parallel workers). When it dies, its children are re-parented
and can no longer be found from it, yet they may still hold GPU memory the next engine needs.
So the engine notes its process tree once it is ready (:func:`snapshot`) and, when it is shut
down, kills whatever of that tree is still there (:func:`kill_leftovers`). Each process is named
by its pid and its start time, so a pid the kernel gave to another process since is left alone.
Where ``/proc`` does not exist both do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

PROC = Path("/proc")

ProcessId = tuple[int, int]
"""A process: ``(pid, start time in clock ticks since boot)``."""


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of ``pid``, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def snapshot(roots: list[int]) -> list[ProcessId]:
    """``roots`` and every descendant of theirs alive now."""
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in PROC.iterdir():
            if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
                parents.setdefault(stat[0], []).append(int(entry.name))
                started[int(entry.name)] = stat[1]
    found: list[ProcessId] = []
    todo = [pid for pid in roots if pid in started]
    while todo:
        pid = todo.pop()
        found.append((pid, started[pid]))
        todo.extend(child for child in parents.get(pid, ()) if child in started)
    return found


def kill_leftovers(processes: list[ProcessId]) -> list[int]:
    """SIGKILL each of ``processes`` still running (same pid, same start time); returns the
    pids killed."""
    killed = []
    for pid, start in processes:
        stat = _stat(pid)
        if stat is None or stat[1] != start:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def _core_processes(llm: Any) -> list[Any]:
    """vLLM's handles on its engine-core processes (``multiprocessing`` processes); [] when
    not known (not started, or a vLLM that keeps them elsewhere)."""
    manager = getattr(getattr(llm, "engine_core", None), "resources", None)
    return list(getattr(getattr(manager, "engine_manager", None), "processes", None) or [])


def core_pids(llm: Any) -> list[int]:
    """Process ids of an ``AsyncLLM``'s engine core(s)."""
    return [int(p.pid) for p in _core_processes(llm) if getattr(p, "pid", None)]


def exit_statuses(llm: Any) -> list[str]:
    """How each engine core of an ``AsyncLLM`` that has exited ended, in words."""
    return [
        _exit_status(p.pid, p.exitcode)
        for p in _core_processes(llm)
        if getattr(p, "exitcode", None) not in (None, 0)
    ]


def _exit_status(pid: int, code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"engine core {pid} killed by {signal.Signals(-code).name}"
    return f"engine core {pid} exited with status {code}"
