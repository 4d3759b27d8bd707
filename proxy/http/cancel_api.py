"""The proxy's own cancel by id on its HTTP listener: ``POST /v2/requests/{id}/cancel`` answered
for the calls it holds (issue 49), whatever server is behind it.

The same path, token and answers as the gateway's cancel API (``hangup_contract.cancel``): 401
without ``Authorization: Bearer <token>`` (the proxy's ``--cancel-token-file``; with none the
API is off and the path is relayed like any other), 400 for a body that is not the contract's,
200 ``{"request_id", "state": "cancelled"}`` for a call it holds (ended the way its adapter
ends a hang-up: ``proxy.http.relay``), 200 ``finished`` for one that ended within
``--tombstone-ttl``, and for an id it does not hold: relayed to the gateway with the ``hangup``
adapter (the call may live there by another way), else 404 with a tombstone, so that a call
arriving under that id within ``--tombstone-ttl`` is refused (499). The answer has no ``phase``
and no ``generated_tokens``: the proxy does not see the engine (the gateway's metrics and log
do).

The answer waits for the upstream cancel the adapter makes, if any (at most
``--cancel-deadline``); ``finished`` when the upstream says every call had already ended. With
``--workers``, an id this worker does not hold is asked of the others (``proxy.calls.siblings``),
and a tombstone is left in every worker.
"""

from __future__ import annotations

import json

from hangup_contract.cancel import bearer_matches, parse_request
from proxy.calls.held import HeldCalls
from proxy.calls.siblings import Siblings
from proxy.messages import Answer, Request, error_answer

_BODY_LIMIT = 64 * 1024


def _state(request_id: str, state: str) -> Answer:
    body = json.dumps({"request_id": request_id, "state": state}).encode()
    return Answer(200, body, content_type="application/json")


class CancelById:
    """Answers the cancel API for ``held`` (the module docstring)."""

    def __init__(
        self, held: HeldCalls, token: str, *, relay_unknown: bool, body_timeout: float,
        siblings: Siblings | None = None,
    ) -> None:  # fmt: skip
        self._held = held
        self._siblings = siblings
        self._token = token
        self._relay_unknown = relay_unknown
        self._body_timeout = body_timeout

    async def answer(self, request: Request, request_id: str) -> Answer | None:
        """The answer to a cancel of ``request_id``; None to relay it upstream."""
        if not bearer_matches(request.header("Authorization"), self._token):
            answer = error_answer(401, "the cancel API needs 'Authorization: Bearer <token>'")
            return self._after_body(request, answer)
        body = b""
        async for chunk in request.content.chunks(self._body_timeout):
            body += chunk
            if len(body) > _BODY_LIMIT:
                return self._after_body(request, error_answer(413, "cancel body over 64 KiB"))
        try:
            parse_request(body)  # checked as the gateway checks it; the proxy's reason is its own
        except ValueError as exc:
            return error_answer(400, str(exc))
        state = await self._held.cancel(request_id)
        siblings = self._siblings
        if state is None and siblings is not None:  # --workers: held by another?
            answers = await siblings.ask("cancel", request_id)
            state = next((s for s in ("cancelled", "finished") if s in answers), None)
        if state is not None:
            return _state(request_id, state)
        if self._relay_unknown:
            return None
        self._held.bury(request_id)
        if siblings is not None:
            siblings.tell("bury", request_id)
        return error_answer(404, f"no call {request_id!r} is held here")

    @staticmethod
    def _after_body(request: Request, answer: Answer) -> Answer:
        """An answer given before the body was read: the connection closes after it."""
        if not request.content.is_eof():
            answer.force_close()
        return answer
