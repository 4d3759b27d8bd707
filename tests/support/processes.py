"""Starting hangup's real processes for the tests: what the demos and benchmarks use too
(``bench/harness/processes.py``: ``spawn``, ``start``, ``Process``, ``REPO``), and what only the
tests need (process trees, groups, stalls, stopping a process for a while)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

# re-exported from the harness the demos ship with: the tests' one place
from bench.harness.processes import REPO as REPO
from bench.harness.processes import Process as Process
from bench.harness.processes import _kill as _kill
from bench.harness.processes import child_env as child_env
from bench.harness.processes import spawn as spawn
from bench.harness.processes import start as start
from bench.harness.processes import stop_group as stop_group
from bench.harness.processes import wait_ready as wait_ready

T = TypeVar("T")


def enter_together(
    stack: contextlib.ExitStack, *managers: contextlib.AbstractContextManager[T]
) -> list[T]:
    """Enter ``managers`` side by side, each in a thread of its own (servers that take tens of
    seconds to start, most of it one process importing, start in about the time of the slowest),
    each exited by ``stack``. If one fails, the others are still entered (and exited by
    ``stack``), then the first failure is raised."""
    with concurrent.futures.ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
    entered: list[T] = []
    failure: BaseException | None = None
    for manager, future in zip(managers, futures, strict=True):
        if error := future.exception():
            failure = failure or error
        else:
            stack.push(manager)
            entered.append(future.result())
    if failure is not None:
        raise failure
    return entered


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...)."""
    return [p for child in children(pid) for p in (child, *descendants(child))]


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (Linux /proc; a zombie, exited but not reaped, is not)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


def group_members(pgid: int) -> list[int]:
    """The running processes of process group ``pgid`` (Linux /proc; zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing paren.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def environ_of(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with (Linux /proc)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def log_events(process: Process, *names: str) -> list[dict[str, object]]:
    """``process``'s JSON log lines whose ``msg`` is one of ``names``."""
    lines = (line for line in process.log().splitlines() if line.startswith("{"))
    events = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            event = json.loads(line)
            if event.get("msg") in names:
                events.append(event)
    return events


def stolen_seconds() -> float:
    """CPU time the hypervisor took from this machine's CPUs so far (``steal`` in /proc/stat),
    summed over CPUs: while it grows by a second per second per CPU, nothing here runs."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


@contextlib.contextmanager
def stalls_explained(*processes: Process) -> Iterator[None]:
    """A failure in the block says what could explain a silence: every event-loop stall the
    processes logged (with where the loop was) and the CPU time the hypervisor stole meanwhile."""
    stolen = stolen_seconds()
    try:
        yield
    except AssertionError as exc:
        stalls = [
            {k: e.get(k) for k in ("ts", "msg", "api_process", "worker", "stalled_s", "stack")}
            for p in processes
            for e in log_events(p, "event_loop_stalled", "event_loop_resumed")
        ]
        stole = stolen_seconds() - stolen
        raise AssertionError(
            f"{exc}\n\nevent-loop stalls logged meanwhile: {json.dumps(stalls, indent=1)}"
            f"\nCPU time stolen by the hypervisor meanwhile: {stole:.2f} s"
        ) from exc


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """``pid`` stopped (SIGSTOP, as a long pause or a debugger stops it) while the block runs."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
