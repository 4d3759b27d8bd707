"""What an engine's processes print, passed on unchanged and read for the last error line.

vLLM's engine core runs in a process it spawns; when the core fails, the reason is in that
process's log (a traceback on its stdout) and nowhere else: the gateway only gets
``EngineDeadError`` ("see the stack trace above"). So while a worker's engine core is being
spawned (:meth:`OutputTail.capture`), this process's stdout and stderr are pipes: the processes
started meanwhile (the core, and the workers it starts) inherit them for life. One thread per
pipe copies every byte to where the output went before (the container's log is unchanged) and
keeps the latest lines that end a Python traceback (``RuntimeError: ...``), vLLM's log prefix
(``(EngineCore pid=…) ERROR … [core.py:…]``) taken off: :meth:`OutputTail.last_error`. The
two pipes are read apart: errors printed on stdout and stderr at the same moment are kept in the
order they are read, either one last.

The gateway's own lines written during the spawn window pass through the same pipes (copied on
at once, never lost); :meth:`OutputTail.forget` drops what was kept before the engine was ready.
:meth:`OutputTail.close` stops the threads once the pipes are drained (after the engine's
processes are gone); a process still holding a pipe then gets EPIPE when it writes.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import select
import sys
import threading
from collections.abc import Iterator

KEEP = 16
"""Error lines kept (the latest)."""
LINE_MAX = 400
"""Characters of an error line kept."""
_POLL_MS = 200

_PREFIX = re.compile(r"^\([^)]*\) +[A-Z]+ +[\d-]+ [\d:.]+ +\[[^\]]*\] ?")
"""vLLM's prefix on a line logged in one of its processes."""
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(: .*)?$")
"""A traceback's last line: the exception's (dotted) class name, then its message."""


def error_line(line: str) -> str | None:
    """``line`` without vLLM's prefix when it names an exception (a traceback's last line)."""
    text = _PREFIX.sub("", line.strip(), count=1)
    return text[:LINE_MAX] if _ERROR.match(text) else None


class OutputTail:
    """The output of the processes spawned inside :meth:`capture`; see the module docstring."""

    def __init__(self) -> None:
        self._errors: collections.deque[str] = collections.deque(maxlen=KEEP)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Point this process's stdout and stderr at the tail's pipes while inside (processes
        started meanwhile keep them); restored on the way out. Not re-entrant; callers hold
        the engine spawn lock."""
        _flush()
        restore: list[tuple[int, int]] = []
        try:
            for fd in (1, 2):
                read, write = os.pipe()
                original = os.dup(fd)
                os.dup2(write, fd)
                os.close(write)
                restore.append((fd, original))
                pump = threading.Thread(
                    target=self._pump, args=(read, os.dup(original)), daemon=True,
                    name=f"engine-output-{fd}",
                )  # fmt: skip
                pump.start()
                self._threads.append(pump)
            yield
        finally:
            _flush()
            for fd, original in restore:
                os.dup2(original, fd)
                os.close(original)

    def last_error(self) -> str:
        """The latest error line seen since :meth:`forget` ("" if none)."""
        with self._lock:
            return self._errors[-1] if self._errors else ""

    def forget(self) -> None:
        with self._lock:
            self._errors.clear()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the threads once nothing is left to read (blocking up to ``timeout``)."""
        self._closing.set()
        for pump in self._threads:
            pump.join(timeout)

    def _pump(self, read: int, out: int) -> None:
        poller = select.poll()
        poller.register(read, select.POLLIN)
        partial = b""
        try:
            while True:
                if not poller.poll(_POLL_MS):
                    if self._closing.is_set():
                        return
                    continue
                data = os.read(read, 65536)
                if not data:  # every writer is gone
                    return
                with contextlib.suppress(OSError):  # nowhere to copy to: keep reading anyway
                    _write_all(out, data)
                *lines, partial = (partial + data).split(b"\n")
                partial = partial[-LINE_MAX * 4 :]
                self._keep(lines)
        finally:
            os.close(read)
            os.close(out)

    def _keep(self, lines: list[bytes]) -> None:
        found = [e for line in lines if (e := error_line(line.decode(errors="replace")))]
        if found:
            with self._lock:
                self._errors.extend(found)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
