"""The proxy's own cancel API on its HTTP listener, answered for the calls it holds (issues 49,
66), whatever server is behind it:

- ``POST /v2/requests/{id}/cancel`` (the gateway's contract, ``hangup_contract.cancel``) and
  vLLM PR 55521's ``POST /v1/requests/{id}/cancel`` and ``DELETE /v1/requests/{id}``: one call,
  by the id it went upstream with, the client's own id (when it keeps the id rule), or its
  answer's own id (``chatcmpl-…``, read from its first bytes: ``proxy.http.answer_ids``);
- ``POST /v2/groups/{group}/cancel``: every call of a job; ``POST /v2/requests/cancel`` and
  ``POST /v1/requests/cancel`` (``{"request_ids": [...]}``): a batch of ids
  (``proxy.http.job_api``);
- ``GET /v2/sidecar/requests`` (``?group=``): the calls held.

The same token and answers as the gateway's: 401 without ``Authorization: Bearer <token>`` (the
proxy's ``--cancel-token-file``; with none the API is off and these paths are relayed like any
other, or refused as admin routes of the server behind: ``proxy.cancel.admin_routes``), 400
for a body that is not the contract's (or a broken chunked one), 408 for one that stalls
``--body-timeout``, 413 over 64 KiB (a batch: ``hangup_contract.jobs.batch_body_limit``).

One id: 200 ``{"request_id", "state": "cancelled"}`` for a call it holds (ended the way its
adapter ends a hang-up: ``proxy.http.relay``), 200 ``finished`` for one that ended within
``--tombstone-ttl``. For an id it does not hold: with the ``hangup`` adapter, the gateway is
asked (the call may live there by another way) by the proxy's own cancel call
(``--cancel-url``, the proxy's token, the caller's ``reason``; nothing else of the caller's
request: its credentials go nowhere), and its answer passed on; else 404 with a tombstone, so
that a call arriving under that id within ``--tombstone-ttl`` is refused (499) — only for an
id that keeps the id rule, the only ids a call is held under. The PR's paths answer as the PR
says: 200 with ``"status": "cancelled"`` for a call cancelled, 404 for one not in flight (ended
ones included). The answer has no ``phase`` and no ``generated_tokens``: the proxy does not see
the engine (the gateway's metrics and log do).

The answer waits for the upstream cancel the adapter makes, if any (at most
``--cancel-deadline``); ``finished`` when the upstream says every call had already ended. With
``--workers``, every other worker is asked too (``proxy.calls.siblings``), and a tombstone is
kept in every worker before the 404 is answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from hangup_contract import jobs
from hangup_contract.cancel import bearer_matches, cancel_path, encode_request, parse_request
from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import CancelKind, Route
from hangup_contract.runtime.connections import BodyStalled
from proxy.calls.held import HeldCalls
from proxy.calls.siblings import Siblings
from proxy.errors import BadBody, UpstreamError
from proxy.http import job_api
from proxy.http.job_api import Post, json_answer
from proxy.messages import Answer, Request, error_answer
from proxy.metrics import ProxyMetrics

BODY_LIMIT = 64 * 1024


class CancelById:
    """Answers the cancel API for ``held`` (the module docstring). ``post``: with the ``hangup``
    adapter, how what is not held here is asked of the gateway. ``listing``: the calls held
    here, for the list (``ServerState.listing``)."""

    def __init__(
        self, held: HeldCalls, token: str, *, post: Post | None, body_timeout: float,
        metrics: ProxyMetrics, max_batch_ids: int = jobs.MAX_BATCH_IDS,
        siblings: Siblings | None = None,
        listing: Callable[[str | None], list[dict[str, object]]] = lambda group: [],
    ) -> None:  # fmt: skip
        self.held = held
        self.siblings = siblings
        self._token = token
        self.post = post
        self._body_timeout = body_timeout
        self.metrics = metrics
        self.max_batch_ids = max_batch_ids
        self.listing = listing

    async def answer(self, request: Request, request_id: str) -> Answer:
        """The answer to a cancel of ``request_id`` (``POST /v2/requests/{id}/cancel``)."""
        return await self.route(request, Route("single", request_id=request_id))

    async def route(self, request: Request, route: Route) -> Answer:
        """The answer to ``route`` (``hangup_contract.jobs.route_of``)."""
        if not bearer_matches(request.header("Authorization"), self._token):
            answer = error_answer(401, "the cancel API needs 'Authorization: Bearer <token>'")
            return after_body(request, answer)
        if route.kind == "held":
            return after_body(request, await job_api.listing(self, request.raw_path))
        limit = jobs.batch_body_limit(self.max_batch_ids) if route.kind == "batch" else BODY_LIMIT
        try:
            body = await self._body(request, limit)
        except _Refused as refused:
            return after_body(request, refused.answer)
        if route.kind == "batch":
            return await job_api.batch(self, body, vllm=route.vllm)
        try:
            reason = parse_request(body)
        except ValueError as exc:
            return error_answer(400, str(exc))
        if route.kind == "group":
            return await job_api.group(self, route.group, reason)
        return await self._single(route.request_id, reason, vllm=route.vllm)

    async def _single(self, request_id: str, reason: Reason, *, vllm: bool) -> Answer:
        state = await self.cancel(request_id)
        if state is not None:
            self.metrics.cancel_answered(CancelKind.SINGLE, [state])
            if vllm and state != "cancelled":
                return error_answer(404, f"request {request_id!r} is not in flight: it has ended")
            body: dict[str, object] = {"status": "cancelled"} if vllm else {}
            return json_answer(200, body | {"request_id": request_id, "state": state})
        if self.post is not None:
            answer = await self._forwarded(request_id, reason, self.post)
            self.metrics.cancel_answered(CancelKind.SINGLE, [_state_of(answer)])
            return as_vllm(answer) if vllm else answer
        await self.bury(request_id)
        self.metrics.cancel_answered(CancelKind.SINGLE, [jobs.NOT_FOUND])
        return error_answer(404, f"no call {request_id!r} is held here")

    async def _body(self, request: Request, limit: int) -> bytes:
        """The body, whole; raises ``_Refused`` with the answer for one the API refuses."""
        body = bytearray()  # grown in place: bytes += bytes would copy it all each chunk
        try:
            async for chunk in request.content.chunks(self._body_timeout):
                body += chunk
                if len(body) > limit:
                    raise _Refused(error_answer(413, f"cancel body over {limit} bytes"))
        except BodyStalled as exc:
            raise _Refused(error_answer(408, str(exc))) from exc
        except BadBody as exc:
            raise _Refused(error_answer(400, exc.message)) from exc
        except ConnectionError as exc:  # the client left: nobody reads this
            raise _Refused(error_answer(400, f"the client left: {exc}")) from exc
        return bytes(body)

    async def cancel(self, request_id: str) -> str | None:
        """End what every worker holds under ``request_id``: ``cancelled`` if any was,
        ``finished`` if one had ended, None when none knows of it."""
        here = self.held.cancel(request_id)
        if self.siblings is None:
            states: list[str | None] = [await here]
        else:
            mine, theirs = await asyncio.gather(here, self.siblings.ask("cancel", request_id))
            states = [mine, *theirs]
        return next((s for s in ("cancelled", "finished") if s in states), None)

    async def bury(self, request_id: str) -> None:
        """A tombstone for ``request_id`` in every worker (answered once every worker keeps
        it)."""
        self.held.bury(request_id)
        if self.siblings is not None:
            await self.siblings.ask("bury", request_id)

    @staticmethod
    async def _forwarded(request_id: str, reason: Reason, post: Post) -> Answer:
        try:
            status, body = await post(cancel_path(request_id), encode_request(reason), BODY_LIMIT)
        except UpstreamError as exc:
            return error_answer(exc.status, exc.message)
        return Answer(status, body, content_type="application/json")


def as_vllm(answer: Answer) -> Answer:
    """The gateway's answer to one id, as PR 55521 answers: 200 only for a call cancelled
    (``"status": "cancelled"`` added), 404 for one that had ended."""
    state = _state_of(answer)
    if answer.status != 200 or state not in ("cancelled", "finished"):
        return answer
    if state == "finished":
        return error_answer(404, "the request is not in flight: it has ended")
    return json_answer(200, {"status": "cancelled"} | json.loads(answer.body))


def _state_of(answer: Answer) -> str:
    """What a forwarded answer found: its ``state`` (200), ``not_found`` (404), else ``error``."""
    if answer.status == 404:
        return jobs.NOT_FOUND
    try:
        state = json.loads(answer.body).get("state") if answer.status == 200 else None
    except (ValueError, AttributeError):
        state = None
    return state if isinstance(state, str) else "error"


class _Refused(Exception):
    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def after_body(request: Request, answer: Answer) -> Answer:
    """An answer given before the body was read: the connection closes after it."""
    if not request.content.is_eof() or request.content.exception() is not None:
        answer.force_close()
    return answer
