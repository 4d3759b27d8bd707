"""Explicit upstream cancel calls: the adapter seam and the canceller that drives it.

A ``CancelAdapter`` makes *one attempt* to cancel an upstream call by id and says what came of
it, or raises ``CancelAttemptFailed`` when another attempt may do better (the endpoint is down,
slow or overloaded). ``hangup`` speaks the cancel contract (``hangup_contract.cancel``); ``none``
makes no call at all (the relay still closes the upstream stream). Other upstreams' cancel APIs
plug in as new adapters.

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
from collections.abc import Callable, Mapping
from typing import Protocol as Interface
from typing import runtime_checkable

from hangup_contract import cancel as contract
from hangup_contract.vocabulary import CancelState, Reason
from proxy.cancel_wire import Connection, Endpoint, read_response
from proxy.errors import BadResponse, CancelAttemptFailed, StaleConnection
from proxy.metrics import ProxyMetrics
from proxy.vocabulary import CancelResult, Protocol

log = logging.getLogger("hangup.proxy.cancel")

CancelTask = asyncio.Task[CancelResult | None]

_MAX_IDLE = 16  # idle keep-alive connections an adapter keeps for its next cancel calls
_TEND_EVERY = 1.0  # seconds between checks that an idle connection is ready (see _tend)


class CancelAdapter(Interface):
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


@runtime_checkable
class SendsNow(Interface):
    """An adapter that can put an attempt on the wire before returning (no event-loop turn)."""

    def send_now(self, request_id: str, reason: Reason) -> asyncio.Task[CancelResult] | None:
        """Start one attempt now, its answer read by the task; None when it cannot start now."""
        ...


class NoCancelAdapter:
    """``--cancel-adapter none``: the upstream learns of a hang-up only from its closed stream."""

    name = "none"
    calls_upstream = False

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        return CancelResult.OK

    async def close(self) -> None:
        return None


class HangupCancelAdapter:
    """The cancel contract's HTTP call: ``POST {base}/v2/requests/{id}/cancel`` with ``{"reason"}``.

    200 ``cancelled`` → ok, 200 ``finished`` → finished, 404 → not_found, other 4xx → error
    (retrying cannot fix a bad token); 5xx, 429, refused or timed-out connections are retried.

    It speaks HTTP/1.1 itself over keep-alive connections of its own (cancel calls never queue
    behind the relay's connections), because a general client costs event-loop turns before the
    request leaves: ``send_now`` writes the request on an idle connection before it returns, in
    the same callback that saw the hang-up. A reused connection the server had already closed
    is replaced once within the attempt (cancelling is idempotent). Once it has made a call, it
    keeps one connection ready: servers close idle ones (uvicorn after 5 s), and a hang-up that
    finds none waits for a connect.
    """

    name = "hangup"
    calls_upstream = True

    def __init__(self, base_url: str, token: str | None, attempt_timeout: float) -> None:
        self._endpoint = Endpoint.parse(base_url)
        head = f"Host: {self._endpoint.netloc}\r\nContent-Type: application/json\r\n"
        if token:
            if any(c in token for c in "\r\n"):
                raise ValueError("the cancel token must be one line")
            head += f"Authorization: Bearer {token}\r\n"
        self._head = head
        self._timeout = attempt_timeout
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._tending: asyncio.TimerHandle | None = None
        self._spare: asyncio.Task[None] | None = None
        self._closed = False

    def send_now(self, request_id: str, reason: Reason) -> asyncio.Task[CancelResult] | None:
        """Write the cancel request now on an idle connection; the task reads the answer.

        None when no connection is idle (``cancel`` then opens one).
        """
        conn = self._take_idle()
        if conn is None:
            return None
        request = self._request(request_id, reason)
        conn.writer.write(request)
        return asyncio.get_running_loop().create_task(self._answer(conn, request, reused=True))

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        request = self._request(request_id, reason)
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        conn.writer.write(request)
        return await self._answer(conn, request, reused=reused)

    def _request(self, request_id: str, reason: Reason) -> bytes:
        body = contract.encode_request(reason)
        path = self._endpoint.prefix + contract.cancel_path(request_id)
        head = f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        return head.encode("latin-1") + body

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            self._discard(conn)
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self._timeout):
                reader, writer = await asyncio.open_connection(
                    self._endpoint.host, self._endpoint.port, ssl=self._endpoint.tls
                )
        except (TimeoutError, OSError) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        conn = Connection(reader, writer)
        self._open.add(conn)
        return conn

    async def _answer(self, conn: Connection, request: bytes, *, reused: bool) -> CancelResult:
        """Read the answer to ``request`` (written on ``conn``) within the attempt's time."""
        keep = False
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    status, text, keep = await read_response(conn.reader)
                except StaleConnection:
                    if not reused:
                        raise
                    self._discard(conn)
                    conn = await self._connect()
                    conn.writer.write(request)
                    status, text, keep = await read_response(conn.reader)
        except (TimeoutError, OSError, StaleConnection, BadResponse) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if keep:
                self._idle.append(conn)
                if len(self._idle) > _MAX_IDLE:
                    self._discard(self._idle.pop(0))
            else:
                self._discard(conn)
            if self._tending is None and not self._closed:
                self._tend()
        return self._result(status, text)

    def _tend(self) -> None:
        """Every ``_TEND_EVERY`` seconds: drop idle connections the server closed, and open one
        in the background when none is left."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        self._tending = loop.call_later(_TEND_EVERY, self._tend)
        for conn in [c for c in self._idle if not c.usable()]:
            self._idle.remove(conn)
            self._discard(conn)
        if not self._idle and (self._spare is None or self._spare.done()):
            self._spare = loop.create_task(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            self._idle.append(await self._connect())
        except CancelAttemptFailed as exc:
            log.debug("no spare cancel connection: %s", exc)

    def _discard(self, conn: Connection) -> None:
        self._open.discard(conn)
        conn.writer.close()

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
            answer = contract.CancelAnswer.from_json(text)
        except ValueError as exc:
            log.warning("cancel answered 200 but %s: %s", exc, text[:200])
            return CancelResult.ERROR
        return CancelResult.FINISHED if answer.state is CancelState.FINISHED else CancelResult.OK

    async def close(self) -> None:
        self._closed = True
        if self._tending is not None:
            self._tending.cancel()
        if self._spare is not None:
            self._spare.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spare
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()


class Canceller:
    """Runs cancel calls: shielded, bounded in concurrency, retried with backoff to a deadline.

    One per proxy, with the adapter each protocol's calls are cancelled through (the gRPC
    listener's speak ``hangup.v1.Cancellation``, the HTTP listener's the HTTP cancel call); the
    ``concurrency`` bound is shared by all of them.
    """

    def __init__(
        self,
        adapters: Mapping[Protocol, CancelAdapter],
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
        self._tasks: set[asyncio.Task[CancelResult | None]] = set()

    def submit(
        self,
        request_id: str,
        reason: Reason,
        detected_at: float,
        protocol: Protocol = Protocol.HTTP,
    ) -> asyncio.Task[CancelResult | None]:
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

    def submitter(self, protocol: Protocol) -> Callable[[str, Reason, float], CancelTask]:
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


def open_adapter(
    name: str, base_url: str, token: str | None, attempt_timeout: float
) -> CancelAdapter:
    """The adapter named by ``--cancel-adapter`` (call inside the running event loop)."""
    if name == "none":
        return NoCancelAdapter()
    return HangupCancelAdapter(base_url, token, attempt_timeout)
