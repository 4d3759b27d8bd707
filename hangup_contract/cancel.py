"""The cancel call over HTTP: ``POST /v2/requests/{id}/cancel``, its body and its answer.

Request body (optional): ``{"reason": "<Reason>"}``; no body, or no ``reason``, means
``explicit``. Answer: 200 with ``{"request_id", "state", "phase"?, "generated_tokens",
"legs"?, "usage"?}`` (the ``phase`` and ``usage`` only for a call it cancelled: ``usage`` is
what the call consumed up to the cancel, in OpenAI's shape, :mod:`hangup_contract.usage`;
``legs`` only for a call served disaggregated: ``{"prefill": {...}, "decode": {...}}``, what
each leg's worker freed), 404 for an id never seen. The id in the path is
percent-encoded: a cancel may name one request of a gRPC stream by an alias that carries the
client's own request id (``<call id>:<id>``), which can hold any character (at most 257 in all:
``request_id.is_cancel_id``, the rule a cancel's id keeps).

Both sides encode and parse here; every parse error is a ``ValueError`` naming the problem.
A reader that needs only the answer's state (the proxy) uses :func:`answer_state`, which
accepts phases and fields it does not know: a newer gateway may send them.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from hangup_contract.cancel_labels import CancelState, Phase, Reason
from hangup_contract.usage import Usage

ROUTE = "/v2/requests/{request_id}/cancel"
"""The route, with the id as the path parameter ``request_id`` (decoded by the server)."""


def cancel_path(request_id: str) -> str:
    """The path that cancels ``request_id`` (percent-encoded)."""
    return ROUTE.format(request_id=quote(request_id, safe=""))


_PREFIX, _SUFFIX = ROUTE.split("{request_id}")


def cancelled_id(target: str) -> str | None:
    """The id a request target (path and query, as sent) cancels, :func:`cancel_path`'s
    inverse (the id percent-decoded: it may hold a ``/``); None for another path."""
    path = target.partition("?")[0]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    encoded = path[len(_PREFIX) : -len(_SUFFIX)]
    if not encoded or "/" in encoded:
        return None
    return unquote(encoded, errors="surrogateescape")


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` value carries ``Bearer <token>`` (compared in constant
    time): what the cancel API asks of a caller when a token is set. Any value is compared,
    bytes that are not UTF-8 included (a server hands them over as lone surrogates): such a
    value never matches, and never raises."""
    scheme, _, value = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    )


def encode_request(reason: Reason) -> bytes:
    return json.dumps({"reason": reason.value}).encode()


def parse_request(body: bytes) -> Reason:
    """The reason a cancel call's body names (``explicit`` for an empty body or no reason).

    Raises ``ValueError`` for a body that is not a JSON object, a ``reason`` that is not a
    string, or one that is not a ``Reason``.
    """
    if not body.strip():
        return Reason.EXPLICIT
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON or UTF-8; too deep; too many digits
        raise ValueError(f"cancel body is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError("cancel body must be a JSON object")
    reason = parsed.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError("'reason' must be a string")
    return Reason.parse(reason)


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """What the gateway answers to a cancel of a call it knows."""

    request_id: str
    state: CancelState
    phase: Phase | None
    """Where the call was when cancelled; None when it had finished."""
    generated_tokens: int
    legs: Mapping[str, Mapping[str, object]] | None = None
    """For a disaggregated call: per leg (``prefill``, ``decode``), what its worker freed."""
    usage: Usage | None = None
    """For a call it cancelled: what the call consumed up to the cancel (its prompts' tokens,
    what its engines generated, delivered or not)."""

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {"request_id": self.request_id, "state": self.state.value}
        if self.phase is not None:
            body["phase"] = self.phase.value
        body["generated_tokens"] = self.generated_tokens
        if self.legs is not None:
            body["legs"] = {name: dict(leg) for name, leg in self.legs.items()}
        if self.usage is not None:
            body["usage"] = self.usage.to_json()
        return body

    @classmethod
    def from_json(cls, body: bytes | str) -> CancelAnswer:
        """Parse an answer strictly, for a side that knows every phase the sender may name (the
        gateway's own API processes answering one another). Raises ``ValueError`` naming what is
        missing or wrong, an unknown phase included; a reader that may face a newer sender (the
        proxy) reads :func:`answer_state` instead, which accepts phases and fields it does not
        know."""
        parsed = _answer_object(body)
        state = _state_of(parsed)
        phase = parsed.get("phase")
        if phase is not None and (not isinstance(phase, str) or phase not in set(Phase)):
            raise ValueError(f"cancel answer has no known phase: {phase!r}")
        tokens = parsed.get("generated_tokens", 0)
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise ValueError("'generated_tokens' must be an integer")
        usage = parsed.get("usage")
        return cls(
            request_id=str(parsed.get("request_id", "")),
            state=state,
            phase=Phase(phase) if phase is not None else None,
            generated_tokens=tokens,
            usage=Usage.from_json(usage) if usage is not None else None,
        )


def answer_state(body: bytes | str) -> CancelState:
    """The state a cancel answer names, whatever else it carries: a ``phase`` this side does not
    know (it must still be a string) and fields it does not know are accepted. Raises
    ``ValueError`` for a body that is not a JSON object, a state that is not known, or a phase
    that is not a string."""
    parsed = _answer_object(body)
    state = _state_of(parsed)
    phase = parsed.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise ValueError(f"cancel answer's phase is not a string: {phase!r}")
    return state


def _answer_object(body: bytes | str) -> dict[str, Any]:
    try:
        parsed: Any = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"cancel answer is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError("cancel answer must be a JSON object")
    return parsed


def _state_of(parsed: dict[str, Any]) -> CancelState:
    raw_state = parsed.get("state")
    if not isinstance(raw_state, str) or raw_state not in set(CancelState):
        raise ValueError(f"cancel answer has no known state: {raw_state!r}")
    return CancelState(raw_state)
