"""Liveness: whether this gateway process can still serve, or Kubernetes should restart it.

Readiness (``/v2/health/ready``) says whether a worker serves now; liveness
(``/v2/health/live``, gRPC ``ServerLive``) fails only for what a restart of the container would
cure and waiting would not:

- an engine worker down for longer than ``--engine-down-limit`` (its restarts keep failing, see
  ``gateway_server.engine.pool``);
- an event loop that stopped running for longer than ``--loop-stall-limit``.

A health endpoint served by a stuck loop cannot answer at all, and the kubelet's probe then
fails by its own timeout. The harder case is a loop that is blocked for long stretches and runs
in between: probes that land in between would pass. So a task in the loop writes a heartbeat
every ``beat`` seconds, and a watchdog *thread* (it runs while the loop is blocked) measures
how late it is. A stall past the limit is logged once, with the stack the loop is blocked in,
and liveness fails from then until as long again has passed after the loop ran again: a loop
that keeps stalling fails every probe; one stall fails the probes of one limit's worth of time.
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

log = logging.getLogger("hangup.gateway")


class LoopWatchdog:
    """A heartbeat in the event loop and a thread that notices when it stops (see module)."""

    def __init__(self, stall_limit: float, beat: float = 0.25) -> None:
        self.stall_limit = stall_limit
        self.beat = min(beat, stall_limit / 4) if stall_limit > 0 else beat
        self._last_beat = time.monotonic()
        self._stall_seen_at: float | None = None
        self._stall_s = 0.0
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        """Start beating (in the running loop) and watching (in a daemon thread)."""
        if self.stall_limit <= 0:
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
        logged = False
        while not self._stop.wait(self.beat):
            now = time.monotonic()
            late = now - self._last_beat - self.beat
            if late > self.stall_limit:
                self._stall_seen_at, self._stall_s = now, late
                if not logged:
                    frame = sys._current_frames().get(self._loop_thread)
                    stack = "".join(traceback.format_stack(frame)) if frame else ""
                    log_event(
                        log,
                        "event_loop_stalled",
                        logging.ERROR,
                        stalled_s=round(late, 1),
                        stack=stack,
                    )
                    logged = True
            else:
                logged = False

    def problem(self) -> str | None:
        """Why the loop counts as stuck, or None."""
        seen = self._stall_seen_at
        if seen is None or time.monotonic() - seen > self.stall_limit:
            return None
        return (
            f"the event loop stalled for {self._stall_s:.1f} s "
            f"(--loop-stall-limit {self.stall_limit:g} s)"
        )


def liveness(
    down_for: Callable[[], float], down_limit: float, loop: LoopWatchdog
) -> Callable[[], str | None]:
    """The liveness check: None while live, else why not."""

    def problem() -> str | None:
        down = down_for()
        if down_limit > 0 and down > down_limit:
            return (
                f"an engine worker has been down for {down:.0f} s and could not be started "
                f"again (--engine-down-limit {down_limit:g} s)"
            )
        return loop.problem()

    return problem
