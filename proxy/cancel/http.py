"""Cancel adapters whose cancel is one HTTP POST, on a client of their own; and hangup's call.

:class:`HttpCancelAdapter` is what every such adapter shares: the proxy's HTTP/1.1 client
(``proxy.upstream.client``) on an instance of its own (cancel calls never queue behind the
relay's connections; at most 16 idle, one kept open once a call was made), the first attempt
written in the callback that saw the hang-up (``send_now``), a reused connection that turns out
closed replaced once within the attempt. What differs between servers is a :class:`CancelCall`
(``proxy.cancel.protocols``): which POST cancels an id, and what an answer means.
:class:`HangupCancel` speaks the cancel contract: ``POST {base}/v2/requests/{id}/cancel`` with
``{"reason"}`` (``hangup_contract.cancel``); the calls of other servers are in
``proxy.cancel.servers``.

Why not a general client: aiohttp's, on Python 3.11, writes a request from a task of its own,
and the canceller's task is another; each task is a turn of the event loop, queued behind every
relay callback that became ready meanwhile (a whole engine step's token fan-out at high
concurrency). Here the request for a hang-up is written on an open connection in the callback
that saw the hang-up (asyncio sets TCP_NODELAY).

Every failure of an attempt that another attempt may fix (a refused or timed-out connection, a
connection that ends early, an answer that is not HTTP/1.1 or is over 1 MiB) is raised as
``CancelAttemptFailed``: the canceller retries it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from hangup_contract import cancel as contract
from hangup_contract.cancel_labels import CancelState, Reason
from proxy.cancel.protocols import CancelCall
from proxy.errors import CancelAttemptFailed, UpstreamBroken, UpstreamError
from proxy.labels import CancelResult
from proxy.upstream.client import Client
from proxy.upstream.connection import Response

log = logging.getLogger("hangup.proxy.cancel")

MAX_BODY = 1024 * 1024  # bytes of answer body accepted (a cancel answer is a small JSON object)
MAX_IDLE = 16  # idle keep-alive connections an adapter keeps for its next cancel calls


class HttpCancelAdapter:
    """A ``CancelAdapter`` (and ``SendsNow``) whose attempt is ``call``'s POST.

    ``base_url`` is where cancel calls go (``http(s)://host[:port][/prefix]``); ``token``, when
    given, goes as ``Authorization: Bearer``; ``attempt_timeout`` bounds one attempt, connect
    included.
    """

    calls_upstream = True

    def __init__(
        self, call: CancelCall, base_url: str, token: str | None, attempt_timeout: float
    ) -> None:
        self.call = call
        self.name = call.name
        self._client = Client(
            base_url,
            connect_timeout=attempt_timeout,
            max_idle=MAX_IDLE,
            idle_ttl=None,
            keep_spare=True,
            what="cancel",
        )
        headers = [("Content-Type", "application/json")]
        if token:
            if any(c in token for c in "\r\n"):
                raise ValueError("the cancel token must be one line")
            headers.append(("Authorization", f"Bearer {token}"))
        self._headers = headers
        self._timeout = attempt_timeout

    def send_now(self, request_id: str, reason: Reason) -> asyncio.Task[CancelResult] | None:
        """Write the cancel request now on an idle connection; the task reads the answer.

        None when no connection is idle (``cancel`` then opens one).
        """
        path, body = self.call.request(request_id, reason)
        sent = self._client.send_now("POST", path, self._headers, body)
        if sent is None:
            return None
        return asyncio.get_running_loop().create_task(self._result(sent))

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        path, body = self.call.request(request_id, reason)
        return await self._result(self._client.request("POST", path, self._headers, body))

    async def forward(self, path: str, body: bytes, limit: int = MAX_BODY) -> tuple[int, bytes]:
        """One POST of ``body`` to ``path`` under the cancel URL, made as the proxy makes its
        own cancel calls (with its token and nothing of a caller's), and the answer as it came:
        its status and body (at most ``limit`` bytes). The proxy's cancel API asks the gateway
        so about ids, groups and batches it does not hold. Raises ``UpstreamError`` when no
        answer came within the attempt's time."""
        try:
            async with asyncio.timeout(self._timeout):
                response = await self._client.request("POST", path, self._headers, body)
                try:
                    answer = await response.read(limit)
                except BaseException:
                    response.close()
                    raise
                response.release()
        except (TimeoutError, OSError, ValueError) as exc:
            raise UpstreamBroken(f"the cancel endpoint did not answer: {exc!r}") from exc
        return response.status, answer

    async def _result(self, sent: Awaitable[Response]) -> CancelResult:
        """The answer to a request sent (or being sent), within the attempt's time."""
        try:
            async with asyncio.timeout(self._timeout):
                response = await sent
                try:
                    body = await response.read(MAX_BODY)
                except BaseException:
                    response.close()
                    raise
                response.release()
        except (TimeoutError, OSError, UpstreamError, ValueError) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        return self.call.result(response.status, body.decode("utf-8", errors="replace"))

    async def close(self) -> None:
        await self._client.close()


class HangupCancel:
    """The cancel contract's HTTP call: ``POST {base}/v2/requests/{id}/cancel`` with ``{"reason"}``.

    200 ``cancelled`` → ok, 200 ``finished`` → finished (phases and fields the proxy does not
    know are ignored: a newer gateway may send them), 404 → not_found, other 4xx → error
    (retrying cannot fix a bad token); 5xx and 429 are retried.
    """

    name = "hangup"

    def request(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        return contract.cancel_path(request_id), contract.encode_request(reason)

    def result(self, status: int, text: str) -> CancelResult:
        if status == 404:
            return CancelResult.NOT_FOUND
        if status == 429 or status >= 500:
            raise CancelAttemptFailed(f"cancel endpoint answered {status}")
        if status != 200:
            log.warning("cancel refused with %d: %s", status, text[:200])
            return CancelResult.ERROR
        try:
            state = contract.answer_state(text)
        except ValueError as exc:
            log.warning("cancel answered 200 but %s: %s", exc, text[:200])
            return CancelResult.ERROR
        return CancelResult.FINISHED if state is CancelState.FINISHED else CancelResult.OK
