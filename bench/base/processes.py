"""Starting hangup's real processes for the demos, benchmarks and tests: ephemeral ports, a
ready file to wait on instead of a sleep, SIGTERM to stop; and reading them from Linux's ``/proc``
(process trees and groups, environments, JSON log events, event-loop stalls, stopping a process
for a while). Ships with ``bench/`` (the image's demos run on it, on the standard library
alone)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")


@dataclass
class Process:
    popen: subprocess.Popen[bytes]
    listeners: dict[str, str]
    log_path: Path

    def url(self, name: str = "http") -> str:
        return f"http://{self.listeners[name]}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit code (SIGKILL after ``timeout``)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: this checkout first on the path, no inherited HANGUP_*, and
    Python's fault handler on: a process (a vLLM engine's too: they inherit it) that dies of a
    fatal signal writes where it was to its log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGUP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra or {})
    return env


def wait_ready(
    popen: subprocess.Popen[bytes], ready: Path, log: Path, timeout: float
) -> dict[str, str]:
    """Wait for ``ready`` to hold the JSON listener map; fail fast if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists() and ready.stat().st_size:
            with contextlib.suppress(json.JSONDecodeError):
                return dict(json.loads(ready.read_text()))
        # Wait on the process itself between looks at the file: an early exit fails at once.
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=0.02)
            raise RuntimeError(f"exited with {popen.returncode} before ready:\n{log.read_text()}")
    popen.kill()
    raise TimeoutError(f"not ready within {timeout}s:\n{log.read_text()}")


def start(
    module: str,
    args: list[str],
    tmp: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    stdin_pipe: bool = False,
    own_group: bool = False,
) -> Process:
    """Run ``python -m module args --ready-file …`` and return it once it is serving (the caller
    stops it; :func:`spawn` is the context-managed form). ``stdin_pipe``: its stdin is a pipe
    this process holds (a supervised child drains when it reads end of file there).
    ``own_group``: it leads a process group of its own (what it starts can be ended with it:
    :func:`group_members`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    ready = tmp / f"{module}.ready.json"
    log = tmp / f"{module}.log"
    ready.unlink(missing_ok=True)
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--ready-file", str(ready)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=REPO,
            stdin=subprocess.PIPE if stdin_pipe else None,
            process_group=0 if own_group else None,
        )
    proc = Process(popen, {}, log)
    try:
        proc.listeners = wait_ready(popen, ready, log, timeout)
    except BaseException:
        if own_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
        _kill(popen)
        raise
    return proc


def stop_group(popen: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """SIGTERM to a process started in a group of its own, ``wait_s`` for it to exit (then
    SIGKILL), then SIGKILL to whatever of its group is left (its children)."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)


def _kill(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.kill()
        popen.wait()


@contextlib.contextmanager
def spawn(
    module: str,
    args: list[str],
    tmp: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    stdin_pipe: bool = False,
) -> Iterator[Process]:
    """Run ``python -m module args --ready-file …`` and yield it once it is serving."""
    proc = start(module, args, tmp, env=env, timeout=timeout, stdin_pipe=stdin_pipe)
    try:
        yield proc
    finally:
        _kill(proc.popen)


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


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state, ppid, pgrp, ...); None
    once the process has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # exited meanwhile
        return None
    # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing paren.
    return stat.rsplit(")", 1)[1].split()


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Every process's pid and stat fields (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry.name)) is not None:
            yield int(entry.name), fields


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (Linux /proc; a zombie, exited but not reaped, is not)."""
    return [pid for pid in pids if (fields := _stat(pid)) is not None and fields[0] != "Z"]


def group_members(pgid: int) -> list[int]:
    """The running processes of process group ``pgid`` (Linux /proc; zombies left out)."""
    return [pid for pid, fields in _processes() if fields[0] != "Z" and int(fields[2]) == pgid]


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux /proc)."""
    return [child for child, fields in _processes() if int(fields[1]) == pid]


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
