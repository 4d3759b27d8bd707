"""Waiting on a condition, never for a guessed time: the one polling loop the tests, demos and
benchmarks use.

Use these where nothing can notify the test (a metric, another process's call list, a log);
where something can (a queue, a stream, a condition), wait on it directly instead.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

POLL_INTERVAL = 0.005
"""How often a wait looks again."""


def _timed_out(within: float, what: object, explain: Callable[[], str] | None) -> AssertionError:
    detail = f"\n{explain()}" if explain else ""
    return AssertionError(f"timed out after {within}s waiting for {what}{detail}")


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    within: float = ...,
    what: str = ...,
    explain: Callable[[], str] | None = ...,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T],
    within: float = ...,
    what: str = ...,
    explain: Callable[[], str] | None = ...,
) -> T: ...


async def wait_until(
    predicate: Callable[[], Awaitable[T] | T],
    within: float = 10.0,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something true, and return that; fail after
    ``within`` seconds naming ``what`` (and what ``explain`` says about the state then)."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise _timed_out(within, what or predicate, explain)
        await asyncio.sleep(POLL_INTERVAL)


def poll_until(
    predicate: Callable[[], T],
    within: float,
    what: str,
    interval: float = POLL_INTERVAL,
    explain: Callable[[], str] | None = None,
) -> T:
    """Blocking twin of :func:`wait_until`, for synchronous tests and clients."""
    deadline = time.monotonic() + within
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise _timed_out(within, what, explain)
        time.sleep(interval)
    return result


async def run_ready_callbacks(turns: int = 10) -> None:
    """Let the event loop run what the test's last step made ready (callbacks, woken tasks, a
    few hops deep) without letting any time pass: for asserting that something has *not*
    happened, where there is no event to wait for."""
    for _ in range(turns):
        await asyncio.sleep(0)
