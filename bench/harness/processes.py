"""Starting hangup's real processes for the demos, benchmarks and tests: ephemeral ports, a
ready file to wait on instead of a sleep, SIGTERM to stop. Ships with ``bench/`` (the image's
demos run on it); ``tests/support/processes.py`` adds what only the tests need."""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parents[2]


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
