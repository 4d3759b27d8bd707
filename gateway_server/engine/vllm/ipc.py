"""vLLM's IPC sockets in a directory of the gateway's own, emptied as its engines stop.

vLLM's processes talk over ZMQ IPC sockets named ``$VLLM_RPC_BASE_PATH/<uuid>`` (the temporary
directory by default) and never unlink them: every engine start leaves its socket files behind, so
a worker that dies and comes back, again and again over a pod's life, fills the pod's /tmp with
them. Unless the operator has set ``VLLM_RPC_BASE_PATH``, a process's engines make theirs in a
directory of its own (``hangup-ipc-*`` in the temporary directory; not where that would make a
socket's path longer than a unix socket's can be: a warning is logged and vLLM keeps its default).
The variable is set once, as the process's first engine starts, and never changed: vLLM's processes
read it as they start, and its engine core keeps what it read. The files that appear there while an
engine starts are that engine's (starts are one at a time: :meth:`IpcDirectory.files_made` holds a
lock for the whole start); they are unlinked when the engine stops, the directory when the process
exits. A process killed outright leaves its directory behind, a few files per worker. Where the
operator set the variable, the directory is theirs and nothing in it is touched.
"""

from __future__ import annotations

import atexit
import contextlib
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


class IpcDirectory:
    """Where one process's vLLM engines make their IPC sockets (see the module docstring); the
    engine factory makes one and gives it to every engine it makes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decided = False
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
        path = Path(tempfile.mkdtemp(prefix=PREFIX))
        if len(str(path)) + 1 + _NAME > SOCKET_PATH_MAX:
            # vLLM could not bind a socket in here; it keeps its default (the directory above).
            path.rmdir()
            log_event(log, "vllm_ipc_directory_too_long", logging.WARNING, path=str(path))
            return None
        self.path = path
        os.environ[RPC_BASE_PATH] = str(path)
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        return path


def _entries(path: Path) -> set[Path]:
    return set(path.iterdir())
