"""OpenAI Responses calls that outlive their client: the proxy makes no cancel call for them.

A response created with ``"background": true`` is meant to run on after its client leaves
(OpenAI's contract, which vLLM keeps: it cancels one only by
``POST /v1/responses/{id}/cancel``). The proxy cannot learn that from the answer: a background
``POST /v1/responses`` with ``"stream": true`` answers with a stream as long as the generation,
like a streaming response that is not background. So it reads the body of every
``POST /v1/responses`` whole (the small JSON of a request, up to ``--max-body-size`` or 8 MiB)
and looks at ``background`` itself. Every call on a path below ``/v1/responses/`` (retrieving a
stored response, resuming its events with ``?stream=true``, deleting or cancelling one) is no
generation: the response it names was started by an earlier call. A hang-up on either kind
closes the upstream stream and makes no cancel call (``proxy.calls.lifecycle``).

``background`` is read as vLLM's request model reads it (pydantic's lax booleans: ``true``, ``1``,
``"yes"``...): a value the server would take for true must not be cancelled by the proxy.
"""

from __future__ import annotations

import json

RESPONSES = "/v1/responses"
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})


def reads_body(method: str, path: str) -> bool:
    """Whether the proxy reads this request's body whole to see if it asks for a background
    response (``POST /v1/responses``)."""
    return method == "POST" and path == RESPONSES


def names_a_response(path: str) -> bool:
    """A call about a response an earlier call started (retrieve, resume, delete, cancel):
    nothing it runs is cancelled when its client leaves."""
    return path.startswith(RESPONSES + "/")


def asks_for_background(body: bytes) -> bool:
    """Whether a ``POST /v1/responses`` body asks for a background response; False for a body
    that is not a JSON object (the server refuses it)."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(payload, dict):
        return False
    value = payload.get("background")
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS
