"""Explicit upstream cancel calls: the adapter seam and the canceller that drives it.

A ``CancelAdapter`` makes *one attempt* to cancel an upstream call by id and says what came of
it, or raises ``CancelAttemptFailed`` when another attempt may do better (the endpoint is down,
slow or overloaded). ``hangup`` speaks DESIGN.md's contract; ``none`` makes no call at all (the
relay still closes the upstream stream). Other upstreams' cancel APIs plug in as new adapters.

The ``Canceller`` owns every cancel in flight. ``submit`` starts one as its own task, so the
handler that detected the hang-up can be cancelled or return without taking the cancel with it
(the call is shielded by construction). At most ``concurrency`` calls run at once; each is
retried with doubling, jittered backoff until ``deadline`` seconds after the hang-up, then counted
``gave_up``. A dead cancel endpoint therefore costs one task per hang-up and never blocks the
relay of other streams. ``drain`` waits for the calls in flight at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from typing import Protocol
from urllib.parse import quote

import aiohttp

from proxy.metrics import ProxyMetrics
from proxy.vocabulary import CancelResult, Reason

log = logging.getLogger("hangup.proxy.cancel")


class CancelAttemptFailed(Exception):
    """One cancel attempt failed in a way another attempt may fix (retried until the deadline)."""


class CancelAdapter(Protocol):
    """How the proxy asks one kind of upstream to cancel a call by id."""

    @property
    def name(self) -> str:
        """The ``adapter`` label value."""
        ...

    @property
    def calls_upstream(self) -> bool:
        """False when the adapter makes no call (nothing is counted for it)."""
        ...

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        """One attempt; raises ``CancelAttemptFailed`` when retrying may help."""
        ...

    async def close(self) -> None: ...


class NoCancelAdapter:
    """``--cancel-adapter none``: the upstream learns of a hang-up only from its closed stream."""

    name = "none"
    calls_upstream = False

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        return CancelResult.OK

    async def close(self) -> None:
        return None


class HangupCancelAdapter:
    """DESIGN.md's cancel API: ``POST {base}/v2/requests/{id}/cancel`` with ``{"reason"}``.

    200 ``cancelled`` → ok, 200 ``finished`` → finished, 404 → not_found, other 4xx → error
    (retrying cannot fix a bad token); 5xx, 429, refused or timed-out connections are retried.
    """

    name = "hangup"
    calls_upstream = True

    def __init__(self, base_url: str, token: str | None, attempt_timeout: float) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=attempt_timeout)
        # A pool of its own: cancel calls never queue behind the relay's connections.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30), timeout=self._timeout
        )

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        url = f"{self._base}/v2/requests/{quote(request_id, safe='')}/cancel"
        body = json.dumps({"reason": reason.value})
        try:
            async with self._session.post(url, data=body, headers=self._headers) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        return self._result(resp.status, text)

    @staticmethod
    def _result(status: int, text: str) -> CancelResult:
        if status == 404:
            return CancelResult.NOT_FOUND
        if status == 429 or status >= 500:
            raise CancelAttemptFailed(f"cancel endpoint answered {status}")
        if status != 200:
            log.warning("cancel refused with %d: %s", status, text[:200])
            return CancelResult.ERROR
        try:
            state = json.loads(text).get("state")
        except (ValueError, AttributeError):
            state = None
        if state == "finished":
            return CancelResult.FINISHED
        if state == "cancelled":
            return CancelResult.OK
        log.warning("cancel answered 200 without a known state: %s", text[:200])
        return CancelResult.ERROR

    async def close(self) -> None:
        await self._session.close()


class Canceller:
    """Runs cancel calls: shielded, bounded in concurrency, retried with backoff to a deadline."""

    def __init__(
        self,
        adapter: CancelAdapter,
        metrics: ProxyMetrics,
        *,
        deadline: float,
        backoff: float,
        backoff_max: float,
        concurrency: int,
    ) -> None:
        self.adapter = adapter
        self.metrics = metrics
        self._deadline = deadline
        self._backoff = backoff
        self._backoff_max = backoff_max
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[CancelResult | None]] = set()

    def submit(
        self, request_id: str, reason: Reason, detected_at: float
    ) -> asyncio.Task[CancelResult | None]:
        """Start cancelling ``request_id``; the task's result is the outcome (None: no call)."""
        task = asyncio.get_running_loop().create_task(self._run(request_id, reason, detected_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(
        self, request_id: str, reason: Reason, detected_at: float
    ) -> CancelResult | None:
        if not self.adapter.calls_upstream:
            return None
        self.metrics.cancels_pending.inc()
        try:
            result = await self._attempts(request_id, reason, detected_at + self._deadline)
        except asyncio.CancelledError:
            # Only drain() cancels these: the proxy is exiting with the call still unanswered.
            self.metrics.cancel_call(self.adapter.name, CancelResult.GAVE_UP, None)
            raise
        finally:
            self.metrics.cancels_pending.dec()
        acknowledged = result in {CancelResult.OK, CancelResult.FINISHED, CancelResult.NOT_FOUND}
        elapsed = time.monotonic() - detected_at if acknowledged else None
        self.metrics.cancel_call(self.adapter.name, result, elapsed)
        return result

    async def _attempts(self, request_id: str, reason: Reason, give_up_at: float) -> CancelResult:
        delay = self._backoff
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout_at(self._loop_time(give_up_at)):
                    async with self._slots:
                        return await self.adapter.cancel(request_id, reason)
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
        await self.adapter.close()


def open_adapter(
    name: str, base_url: str, token: str | None, attempt_timeout: float
) -> CancelAdapter:
    """The adapter named by ``--cancel-adapter`` (call inside the running event loop)."""
    if name == "none":
        return NoCancelAdapter()
    return HangupCancelAdapter(base_url, token, attempt_timeout)
