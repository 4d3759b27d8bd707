"""Explicit upstream cancel calls: the canceller that drives the adapters.

A ``CancelAdapter`` (``proxy.cancel.protocols``) makes *one attempt* to cancel an upstream call by
id and says what came of it, or raises ``CancelAttemptFailed`` when another attempt may do
better (the endpoint is down, slow or overloaded). ``hangup`` speaks the cancel contract
(``hangup_contract.cancel``); ``none`` makes no call at all (the relay still closes the
upstream stream). Other upstreams' cancel APIs plug in as new adapters.

The ``Canceller`` owns every cancel in flight. ``submit`` starts one as its own task, so the
handler that detected the hang-up can be cancelled or return without taking the cancel with it
(the call is shielded by construction). At most ``concurrency`` calls run at once; each is
retried with doubling, jittered backoff until ``deadline`` seconds after the hang-up, then counted
``gave_up``. A dead cancel endpoint therefore costs one task per hang-up and never blocks the
relay of other streams. ``drain`` waits for the calls in flight at shutdown.

Latency: when a slot is free and the adapter ``SendsNow`` (``hangup`` does, on a keep-alive
connection of its own), ``submit`` writes the first attempt's request before it returns, so the
cancel call leaves in the same callback that saw the hang-up instead of after one or two more
turns of the event loop, each queued behind the relay work that became ready meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Mapping

from hangup_contract.cancel_labels import Reason
from proxy.cancel.protocols import CancelAdapter, CancelTask, SendsNow, Submit
from proxy.errors import CancelAttemptFailed
from proxy.labels import CallProtocol, CancelResult
from proxy.metrics import ProxyMetrics

log = logging.getLogger("hangup.proxy.cancel")


class Canceller:
    """Runs cancel calls: shielded, bounded in concurrency, retried with backoff to a deadline.

    One per proxy, with the adapter each protocol's calls are cancelled through (the gRPC
    listener's speak ``hangup.v1.Cancellation``, the HTTP listener's the HTTP cancel call); the
    ``concurrency`` bound is shared by all of them.
    """

    def __init__(
        self,
        adapters: Mapping[CallProtocol, CancelAdapter],
        metrics: ProxyMetrics,
        *,
        deadline: float,
        backoff: float,
        backoff_max: float,
        concurrency: int,
    ) -> None:
        self.adapters = dict(adapters)
        self.metrics = metrics
        self._deadline = deadline
        self._backoff = backoff
        self._backoff_max = backoff_max
        self._slots = _Slots(concurrency)
        self._tasks: set[CancelTask] = set()

    def submit(
        self,
        request_id: str,
        reason: Reason,
        detected_at: float,
        protocol: CallProtocol = CallProtocol.HTTP,
    ) -> CancelTask:
        """Start cancelling ``request_id``; the task's result is the outcome (None: no call).

        When a slot is free and the adapter has a connection ready, the first attempt's request
        is written before this returns: a hang-up's cancel call does not wait for the event loop
        to reach the canceller's task behind the relay work that became ready meanwhile.
        """
        adapter = self.adapters[protocol]
        first = self._send_now(adapter, request_id, reason)
        task = asyncio.get_running_loop().create_task(
            self._run(adapter, request_id, reason, detected_at, first)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def submitter(self, protocol: CallProtocol) -> Submit:
        """``submit`` for ``protocol``'s calls."""
        return lambda request_id, reason, detected_at: self.submit(
            request_id, reason, detected_at, protocol
        )

    def _send_now(
        self, adapter: CancelAdapter, request_id: str, reason: Reason
    ) -> asyncio.Task[CancelResult] | None:
        if not adapter.calls_upstream or not isinstance(adapter, SendsNow):
            return None
        if not self._slots.take_now():
            return None
        attempt = adapter.send_now(request_id, reason)
        if attempt is None:
            self._slots.give()
            return None
        attempt.add_done_callback(self._attempt_done)
        return attempt

    def _attempt_done(self, attempt: asyncio.Task[CancelResult]) -> None:
        self._slots.give()
        if not attempt.cancelled():
            attempt.exception()  # retrieved here too, in case the canceller's task never ran

    async def _run(
        self,
        adapter: CancelAdapter,
        request_id: str,
        reason: Reason,
        detected_at: float,
        first: asyncio.Task[CancelResult] | None,
    ) -> CancelResult | None:
        if not adapter.calls_upstream:
            return None
        self.metrics.cancels_pending.inc()
        try:
            result = await self._attempts(
                adapter, request_id, reason, detected_at + self._deadline, first
            )
        except asyncio.CancelledError:
            # Only drain() cancels these: the proxy is exiting with the call still unanswered.
            self.metrics.cancel_call(adapter.name, CancelResult.GAVE_UP, None)
            raise
        finally:
            self.metrics.cancels_pending.dec()
            if first is not None:
                first.cancel()  # no-op once answered; stops it if this task ended early
        acknowledged = result in {CancelResult.OK, CancelResult.FINISHED, CancelResult.NOT_FOUND}
        elapsed = time.monotonic() - detected_at if acknowledged else None
        self.metrics.cancel_call(adapter.name, result, elapsed)
        return result

    async def _attempts(
        self,
        adapter: CancelAdapter,
        request_id: str,
        reason: Reason,
        give_up_at: float,
        first: asyncio.Task[CancelResult] | None,
    ) -> CancelResult:
        delay = self._backoff
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout_at(self._loop_time(give_up_at)):
                    if first is not None:
                        started, first = first, None
                        return await started  # its slot was taken by submit()
                    async with self._slots:
                        return await adapter.cancel(request_id, reason)
            except TimeoutError:
                log.warning("cancel %s gave up after %d attempts", request_id, attempt)
                return CancelResult.GAVE_UP
            except CancelAttemptFailed as exc:
                pause = min(delay, self._backoff_max) * random.uniform(0.5, 1.0)
                if time.monotonic() + pause >= give_up_at:
                    log.warning("cancel %s gave up after %d attempts: %s", request_id, attempt, exc)
                    return CancelResult.GAVE_UP
                log.info("cancel %s attempt %d failed (%s); retrying", request_id, attempt, exc)
                await asyncio.sleep(pause)
                delay *= 2

    @staticmethod
    def _loop_time(monotonic_deadline: float) -> float:
        loop = asyncio.get_running_loop()
        return loop.time() + (monotonic_deadline - time.monotonic())

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self, within: float) -> None:
        """Wait ``within`` seconds for the cancels in flight, then stop the rest (``gave_up``)."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=within)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        for adapter in self.adapters.values():
            await adapter.close()


class _Slots:
    """A counting semaphore whose free slot can also be taken without waiting (``take_now``)."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    def give(self) -> None:
        """Free a slot, handing it straight to the longest waiter if there is one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as this task was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    async def __aexit__(self, *_: object) -> None:
        self.give()
