"""The proxy's own cancel by id on its HTTP listener: ``POST /v2/requests/{id}/cancel`` answered
for the calls it holds (issue 49), whatever server is behind it.

The same path, token and answers as the gateway's cancel API (``hangup_contract.cancel``): 401
without ``Authorization: Bearer <token>`` (the proxy's ``--cancel-token-file``; with none the
API is off and the path is relayed like any other), 400 for a body that is not the contract's
(or a broken chunked one), 408 for one that stalls ``--body-timeout``, 413 over 64 KiB; 200
``{"request_id", "state": "cancelled"}`` for a call it holds (ended the way its adapter ends a
hang-up: ``proxy.http.relay``), 200 ``finished`` for one that ended within ``--tombstone-ttl``.
For an id it does not hold: with the ``hangup`` adapter, the gateway is asked (the call may
live there by another way) by the proxy's own cancel call (``--cancel-url``, the proxy's token,
the caller's ``reason``; nothing else of the caller's request: its credentials go nowhere),
and its answer passed on; else 404 with a tombstone, so that a call arriving under that id
within ``--tombstone-ttl`` is refused (499) — only for an id that keeps the id rule, the only
ids a call is held under. The answer has no ``phase`` and no ``generated_tokens``: the proxy
does not see the engine (the gateway's metrics and log do).

The answer waits for the upstream cancel the adapter makes, if any (at most
``--cancel-deadline``); ``finished`` when the upstream says every call had already ended. With
``--workers``, every other worker is asked too (``proxy.calls.siblings``), and a tombstone is
kept in every worker before the 404 is answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from hangup_contract.cancel import bearer_matches, parse_request
from hangup_contract.runtime.connections import BodyStalled
from hangup_contract.vocabulary import Reason
from proxy.calls.held import HeldCalls
from proxy.calls.siblings import Siblings
from proxy.errors import BadBody, UpstreamError
from proxy.messages import Answer, Request, error_answer

BODY_LIMIT = 64 * 1024

Forward = Callable[[str, Reason], Awaitable[tuple[int, bytes]]]
"""The proxy's own cancel call for an id, answered as it came (``HttpCancelAdapter.forward``)."""


def _state(request_id: str, state: str) -> Answer:
    body = json.dumps({"request_id": request_id, "state": state}).encode()
    return Answer(200, body, content_type="application/json")


class CancelById:
    """Answers the cancel API for ``held`` (the module docstring). ``forward``: with the
    ``hangup`` adapter, how an id not held is asked of the gateway."""

    def __init__(
        self, held: HeldCalls, token: str, *, forward: Forward | None, body_timeout: float,
        siblings: Siblings | None = None,
    ) -> None:  # fmt: skip
        self._held = held
        self._siblings = siblings
        self._token = token
        self._forward = forward
        self._body_timeout = body_timeout

    async def answer(self, request: Request, request_id: str) -> Answer:
        """The answer to a cancel of ``request_id``."""
        if not bearer_matches(request.header("Authorization"), self._token):
            answer = error_answer(401, "the cancel API needs 'Authorization: Bearer <token>'")
            return _after_body(request, answer)
        try:
            body = await self._body(request)
        except _Refused as refused:
            return _after_body(request, refused.answer)
        try:
            reason = parse_request(body)
        except ValueError as exc:
            return error_answer(400, str(exc))
        state = await self._cancel(request_id)
        if state is not None:
            return _state(request_id, state)
        if self._forward is not None:
            return await self._forwarded(request_id, reason, self._forward)
        self._held.bury(request_id)
        if self._siblings is not None:
            await self._siblings.ask("bury", request_id)  # answered once every worker keeps it
        return error_answer(404, f"no call {request_id!r} is held here")

    async def _body(self, request: Request) -> bytes:
        """The body, whole; raises ``_Refused`` with the answer for one the API refuses."""
        body = bytearray()  # grown in place: bytes += bytes would copy it all each chunk
        try:
            async for chunk in request.content.chunks(self._body_timeout):
                body += chunk
                if len(body) > BODY_LIMIT:
                    raise _Refused(error_answer(413, "cancel body over 64 KiB"))
        except BodyStalled as exc:
            raise _Refused(error_answer(408, str(exc))) from exc
        except BadBody as exc:
            raise _Refused(error_answer(400, exc.message)) from exc
        except ConnectionError as exc:  # the client left: nobody reads this
            raise _Refused(error_answer(400, f"the client left: {exc}")) from exc
        return bytes(body)

    async def _cancel(self, request_id: str) -> str | None:
        """End what every worker holds under ``request_id``: ``cancelled`` if any was,
        ``finished`` if one had ended, None when none knows of it."""
        here = self._held.cancel(request_id)
        if self._siblings is None:
            states: list[str | None] = [await here]
        else:
            mine, theirs = await asyncio.gather(here, self._siblings.ask("cancel", request_id))
            states = [mine, *theirs]
        return next((s for s in ("cancelled", "finished") if s in states), None)

    @staticmethod
    async def _forwarded(request_id: str, reason: Reason, forward: Forward) -> Answer:
        try:
            status, body = await forward(request_id, reason)
        except UpstreamError as exc:
            return error_answer(exc.status, exc.message)
        return Answer(status, body, content_type="application/json")


class _Refused(Exception):
    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def _after_body(request: Request, answer: Answer) -> Answer:
    """An answer given before the body was read: the connection closes after it."""
    if not request.content.is_eof() or request.content.exception() is not None:
        answer.force_close()
    return answer
