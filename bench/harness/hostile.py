"""Hostile input, measured: every parser a client reaches must do work linear in its input and
refuse early, so no input holds the event loop (docs/security.md).

Two ways to hold a parser to that:

- :func:`timed` runs one parse in the calling thread and measures the CPU time *that thread*
  spent (``time.thread_time``), not the wall clock: another process on a loaded two-core machine
  cannot make a linear parser look quadratic, nor hide a quadratic one. :class:`Budget` is what a
  parse of ``n`` bytes may cost (``floor + per_mib * n / MiB``; the default 20 ms per MiB, the
  figure docs/security.md states). Property tests feed a parser hostile inputs up to its body
  limit and call :meth:`Budget.check` on each.
- :class:`ArmedLoop` arms a watchdog on a running event loop (an in-process server under attack):
  a thread notices every moment the loop stood longer than ``stall_limit`` seconds, and
  :meth:`ArmedLoop.check` fails naming the longest. The wall clock here: a live server's clients
  feel wall time, and the limits used (a second or so) are far above what a loaded machine adds.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

MIB = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Budget:
    """What parsing ``n`` bytes may cost, in seconds of the parsing thread's CPU."""

    per_mib: float = 0.020
    floor: float = 0.010

    def allows(self, nbytes: int) -> float:
        return self.floor + self.per_mib * nbytes / MIB

    def check(self, what: str, nbytes: int, spent: float) -> None:
        """Raise ``AssertionError`` naming ``what`` when ``spent`` is over the budget."""
        allowed = self.allows(nbytes)
        if spent > allowed:
            raise AssertionError(
                f"{what}: {spent * 1000:.1f} ms of CPU for {nbytes:,} bytes "
                f"(budget {allowed * 1000:.1f} ms: {self.per_mib * 1000:g} ms per MiB "
                f"+ {self.floor * 1000:g} ms)"
            )


@dataclass(slots=True)
class Timed:
    """One parse: its result, or what it raised, and the CPU time it took."""

    result: Any
    error: BaseException | None
    spent: float


@contextmanager
def untraced() -> Iterator[None]:
    """What runs inside is measured as the product would run it: no cyclic garbage collection (one
    that happens to start there walks the whole test process's heap, pytest's and Hypothesis's:
    tens of ms that are not the parser's work, seen on 30-byte inputs on a loaded machine) and no
    tracer in this thread (``make test`` runs under coverage, whose line tracer made a parse of an
    8 MiB body in one-byte chunks cost 300 ms per MiB, not its budget of 40: the tracer's, not the
    parser's; Hypothesis's explain phase traces the same way)."""
    collecting = gc.isenabled()
    tracer = sys.gettrace()
    gc.disable()
    sys.settrace(None)
    try:
        yield
    finally:
        if tracer is not None:
            sys.settrace(tracer)
        if collecting:
            gc.enable()


def timed(parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Timed:
    """Run ``parse(*args, **kwargs)`` :func:`untraced` and measure the calling thread's CPU time;
    an exception it raises is kept in :attr:`Timed.error`, not raised."""
    with untraced():
        start = time.thread_time()
        try:
            result: Any = parse(*args, **kwargs)
            error: Exception | None = None
        except Exception as exc:
            result, error = None, exc
        return Timed(result, error, time.thread_time() - start)


@dataclass
class ArmedLoop:
    """A watchdog over the running event loop (see module): ``async with ArmedLoop(1.0) as
    armed: ...`` then ``armed.check()``."""

    stall_limit: float
    beat: float = 0.02
    stalls: list[float] = field(default_factory=list)
    _last: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _task: asyncio.Task[None] | None = None
    _thread: threading.Thread | None = None

    async def __aenter__(self) -> ArmedLoop:
        self._last = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat())
        self._thread = threading.Thread(target=self._watch, name="armed-loop", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._thread is not None:
            self._thread.join()

    async def _heartbeat(self) -> None:
        while True:
            self._last = time.monotonic()
            await asyncio.sleep(self.beat)

    def _watch(self) -> None:
        longest = 0.0
        while not self._stop.wait(self.beat):
            late = time.monotonic() - self._last - self.beat
            if late > self.stall_limit:
                longest = max(longest, late)
            elif longest:
                self.stalls.append(longest)
                longest = 0.0
        if longest:
            self.stalls.append(longest)

    @property
    def longest(self) -> float:
        return max(self.stalls, default=0.0)

    def check(self) -> None:
        """Raise ``AssertionError`` if the loop stood longer than ``stall_limit`` at any time."""
        if self.stalls:
            raise AssertionError(
                f"the event loop stood {self.longest:.2f} s "
                f"(limit {self.stall_limit:g} s; {len(self.stalls)} stall(s))"
            )
