"""A watchdog for an event loop: notices when the loop stops running, and says where it is.

A task in the loop writes a heartbeat every ``beat`` seconds; a *thread* (it runs while the
loop is blocked) measures how late the heartbeat is. A stall longer than ``log_after`` seconds
is logged as it happens (``event_loop_stalled``, a warning with the stack the loop is blocked
in), counted through ``on_stall``, and logged again when the loop runs (``event_loop_resumed``,
with how long it stood). One longer than ``stall_limit`` is logged as an error and reported by
:meth:`LoopWatchdog.problem` (the gateway's liveness fails on it). A stall the thread itself
cannot see (the loop's thread holding the GIL in C code) is logged once it can, with the stack
of that moment. The gateway and the proxy each run one per process (``--loop-stall-log``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

from hangup_contract.runtime.logs import log_event


class LoopWatchdog:
    """A heartbeat in the event loop and a thread that notices when it stops (see module);
    its log lines go to ``log``."""

    def __init__(
        self,
        stall_limit: float,
        beat: float = 0.25,
        *,
        log_after: float = 0.0,
        on_stall: Callable[[], None] = lambda: None,
        log: logging.Logger,
    ) -> None:
        self._log_to = log
        self.stall_limit = stall_limit
        self.log_after = log_after
        thresholds = [t for t in (stall_limit, log_after) if t > 0]
        self.beat = min(beat, min(thresholds) / 4) if thresholds else beat
        self._on_stall = on_stall
        self._last_beat = time.monotonic()
        self._stall_seen_at: float | None = None
        self._stall_s = 0.0
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        """Start beating (in the running loop) and watching (in a daemon thread)."""
        if self.stall_limit <= 0 and self.log_after <= 0:
            return
        self._loop_thread = threading.get_ident()
        self._last_beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat())
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _heartbeat(self) -> None:
        while True:
            self._last_beat = time.monotonic()
            await asyncio.sleep(self.beat)

    def _watch(self) -> None:
        logged = past_limit = False  # this stall: logged, and logged past the limit
        longest = 0.0  # how late the heartbeat has been in this stall
        while not self._stop.wait(self.beat):
            now = time.monotonic()
            late = now - self._last_beat - self.beat
            if logged and late < self.beat:  # it ran again
                stalled_s = round(longest, 2)
                log_event(self._log_to, "event_loop_resumed", logging.WARNING, stalled_s=stalled_s)
                logged = past_limit = False
                longest = 0.0
            longest = max(longest, late)
            if self.log_after > 0 and late > self.log_after and not logged:
                logged = True
                self._on_stall()
                self._log("event_loop_stalled", logging.WARNING, late)
            if self.stall_limit > 0 and late > self.stall_limit:
                self._stall_seen_at, self._stall_s = now, late
                if not past_limit:
                    if not logged:
                        self._on_stall()
                    past_limit = logged = True
                    self._log("event_loop_stalled", logging.ERROR, late, liveness="failing")

    def _log(self, name: str, level: int, late: float, **fields: str) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        stack = "".join(traceback.format_stack(frame)) if frame else ""
        log_event(self._log_to, name, level, stalled_s=round(late, 2), stack=stack, **fields)

    def problem(self) -> str | None:
        """Why the loop counts as stuck, or None."""
        seen = self._stall_seen_at
        if seen is None or time.monotonic() - seen > self.stall_limit:
            return None
        return (
            f"the event loop stalled for {self._stall_s:.1f} s "
            f"(--loop-stall-limit {self.stall_limit:g} s)"
        )
