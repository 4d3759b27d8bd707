"""Jobs: a group of calls cancelled at once, a batch of ids, and the paths of vLLM PR 55521.

A **group** names the calls of one job. A client tags a call with it: the ``X-Hangup-Group``
header (gRPC metadata ``x-hangup-group``), or, on the gateway's OpenAI routes, the body's
``metadata.hangup_group``. A group keeps the id rule (``request_id.RULE``: 1-128 characters of
``A-Z a-z 0-9 . _ : -``); anything else is refused (400, ``INVALID_ARGUMENT``) before the call
runs. One call of the cancel API then ends every call of the group wherever it is held, and a
call of the group that arrives within the tombstone ttl after is refused as cancelled.

The routes, each behind the cancel token, on the sidecar and the gateway alike:

- ``POST /v2/groups/{group}/cancel`` (body optional: ``{"reason"}``): every call of the group;
- ``POST /v2/requests/cancel`` with ``{"request_ids": [...], "reason"?}``: a batch of ids, each
  answered (at most the server's ``--max-batch-ids``, each a cancel id, a duplicate once);
- vLLM PR 55521's (open; matched as its description and tests stood on 2026-09-06):
  ``POST /v1/requests/{request_id}/cancel`` and ``DELETE /v1/requests/{request_id}`` (200 for a
  call cancelled, 404 for one not in flight, ended ones included) and ``POST
  /v1/requests/cancel`` with ``{"request_ids": [...]}`` (the batch above).

A group or batch answer is :func:`job_answer`'s: ``{"status": "cancelled", "group"?,
"cancelled_request_ids": [...], "results": [...]}``, one entry per call or id, each the single
cancel's answer (``CancelAnswer.to_json()`` on the gateway, ``{"request_id", "state"}`` on the
sidecar) or ``{"request_id", "state": "not_found"}``. ``status`` and ``cancelled_request_ids``
are the PR's words (its ``/abort_requests`` answer); ``results`` say what happened to each id.

A streaming client knows its call by the answer's own ``id`` (``chatcmpl-…``, ``cmpl-…``), not by
an ``X-Request-Id`` it never set: :func:`call_id_of_answer_id` is the call id such an id names
(the gateway's answers are ``<prefix>-<call id>``, as ``vllm serve``'s are).

No I/O: values in, values out; every parse error is a ``ValueError`` naming the problem.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from hangup_contract import request_id as request_ids
from hangup_contract.cancel_labels import Reason

GROUP_HEADER = "X-Hangup-Group"
GROUP_METADATA_KEY = "x-hangup-group"
GROUP_BODY_KEY = "hangup_group"
"""The key of an OpenAI body's ``metadata`` that names the call's group (the gateway's)."""

GROUP_ROUTE = "/v2/groups/{group}/cancel"
BATCH_ROUTE = "/v2/requests/cancel"
VLLM_CANCEL_ROUTE = "/v1/requests/{request_id}/cancel"
VLLM_DELETE_ROUTE = "/v1/requests/{request_id}"
VLLM_BATCH_ROUTE = "/v1/requests/cancel"
HELD_ROUTE = "/v2/sidecar/requests"
"""The sidecar's own list of the calls it holds (``GET``; the gateway's is ``GET /v2/requests``)."""

NOT_FOUND = "not_found"
"""A batch entry's state for an id nobody holds or remembers."""
ENTRY_STATES = ("cancelled", "finished", NOT_FOUND)
"""What an entry of a group or batch answer may say of its id (a label value)."""


class CancelKind(enum.StrEnum):
    """What one call of the cancel API named (a metric label): one id, a group, a batch."""

    SINGLE = "single"
    GROUP = "group"
    BATCH = "batch"


MAX_BATCH_IDS = 1000
"""The default of ``--max-batch-ids``: ids one batch may name."""
ANSWER_ID_PREFIXES = ("chatcmpl-", "cmpl-")


def check_group(value: str | None) -> str | None:
    """``value`` as a group (None: no group). Raises ``ValueError`` naming the rule for one
    that breaks it."""
    if value is None:
        return None
    if not request_ids.is_valid(value):
        raise ValueError(f"a group ({GROUP_HEADER}) must be {request_ids.RULE}")
    return value


def body_group(body: Mapping[str, Any]) -> str | None:
    """The group an OpenAI body's ``metadata.hangup_group`` names (None: none). Raises
    ``ValueError`` for one that is not a string keeping the rule."""
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    value = metadata.get(GROUP_BODY_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not request_ids.is_valid(value):
        raise ValueError(f"'metadata.{GROUP_BODY_KEY}' must be {request_ids.RULE}")
    return value


def one_group(header: str | None, body: str | None) -> str | None:
    """The call's group from its header and its body (either, or both the same). Raises
    ``ValueError`` when they name two."""
    if header is not None and body is not None and header != body:
        raise ValueError(f"{GROUP_HEADER} and 'metadata.{GROUP_BODY_KEY}' name two groups")
    return header if header is not None else body


def call_id_of_answer_id(answer_id: str) -> str | None:
    """The call id an answer's own ``id`` names (``chatcmpl-<call id>``, ``cmpl-<call id>``),
    when it keeps the id rule; else None."""
    for prefix in ANSWER_ID_PREFIXES:
        if answer_id.startswith(prefix):
            call_id = answer_id[len(prefix) :]
            return call_id if request_ids.is_valid(call_id) else None
    return None


# -- the batch body -----------------------------------------------------------------------------


def batch_body_limit(max_ids: int) -> int:
    """Bytes a batch body may have: ``max_ids`` of the longest cancel ids, quoted and escaped
    (a character at most 6 bytes: ``\\u00xx``; an id's own characters are ASCII), and 64 KiB."""
    return 64 * 1024 + max_ids * (request_ids.ALIAS_MAX * 6 + 4)


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch cancel: its ids (each once, in the order given) and its reason."""

    request_ids: tuple[str, ...]
    reason: Reason


def parse_batch(body: bytes, max_ids: int) -> Batch:
    """A batch body: ``{"request_ids": [...], "reason"?}``. Raises ``ValueError`` for a body
    that is not a JSON object, ``request_ids`` missing or not a list, more than ``max_ids`` of
    them, one that is not a string or breaks the cancel rule, or a bad ``reason``."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON or UTF-8; too deep; too many digits
        raise ValueError(f"batch body is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError("batch body must be a JSON object")
    reason = parsed.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError("'reason' must be a string")
    given = parsed.get("request_ids")
    if not isinstance(given, list):
        raise ValueError("'request_ids' must be a list of ids")
    if len(given) > max_ids:
        raise ValueError(
            f"'request_ids' names {len(given)} ids: at most {max_ids} (--max-batch-ids)"
        )
    seen: dict[str, None] = {}
    for at, value in enumerate(given):
        if not isinstance(value, str) or not request_ids.is_cancel_id(value):
            raise ValueError(f"'request_ids[{at}]' must be {request_ids.CANCEL_RULE}")
        seen.setdefault(value)
    return Batch(tuple(seen), Reason.parse(reason))


def encode_batch(ids: Iterable[str], reason: Reason) -> bytes:
    return json.dumps({"request_ids": list(ids), "reason": reason.value}).encode()


# -- answers ------------------------------------------------------------------------------------


def not_found(request_id: str) -> dict[str, object]:
    """A batch entry for an id nobody holds or remembers."""
    return {"request_id": request_id, "state": NOT_FOUND}


def job_answer(entries: Sequence[Mapping[str, object]], group: str | None = None) -> dict[str, Any]:
    """The answer to a group or batch cancel: each entry as given (``CancelAnswer.to_json()``,
    a sidecar's ``{"request_id", "state"}``, or :func:`not_found`)."""
    answer: dict[str, Any] = {"status": "cancelled"}
    if group is not None:
        answer["group"] = group
    answer["cancelled_request_ids"] = [
        e["request_id"] for e in entries if e.get("state") == "cancelled"
    ]
    answer["results"] = [dict(e) for e in entries]
    return answer


def answer_entries(body: bytes | str) -> list[dict[str, Any]]:
    """The ``results`` of a group or batch answer, each an object with a string ``request_id``
    and ``state`` (other fields kept as they came: a newer sender may add some). Raises
    ``ValueError`` for anything else."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"a job answer is not valid JSON: {exc}") from exc
    results = parsed.get("results") if isinstance(parsed, dict) else None
    if not isinstance(results, list):
        raise ValueError("a job answer must be a JSON object with a 'results' list")
    for entry in results:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("request_id"), str)
            and isinstance(entry.get("state"), str)
        ):
            raise ValueError("each result must be an object with a string request_id and state")
    return results


# -- routes, as a sidecar reads a request target --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """What a request on the cancel API asks (:func:`route_of`): ``kind`` is ``single``
    (``request_id``; ``vllm``: the PR's path, answered as the PR says), ``group`` (``group``),
    ``batch``, or ``held`` (the sidecar's list)."""

    kind: str
    request_id: str = ""
    group: str = ""
    vllm: bool = False


def route_of(method: str, target: str) -> Route | None:
    """The job or PR 55521 route a request names (path and query, as sent), percent-decoded;
    None for any other. The single hangup route (``/v2/requests/{id}/cancel``) is
    ``hangup_contract.cancel.cancelled_id``'s."""
    path = target.partition("?")[0]
    if not path.startswith(("/v1/requests", "/v2/")):
        return None
    parts = path.split("/")[1:]
    if method == "GET":
        return Route("held") if path == HELD_ROUTE else None
    if method == "DELETE":
        if len(parts) == 3 and parts[:2] == ["v1", "requests"] and parts[2]:
            return Route(
                "single", request_id=unquote(parts[2], errors="surrogateescape"), vllm=True
            )
        return None
    if method != "POST":
        return None
    if path in (BATCH_ROUTE, VLLM_BATCH_ROUTE):
        return Route("batch", vllm=path == VLLM_BATCH_ROUTE)
    if len(parts) == 4 and parts[3] == "cancel" and parts[2]:
        name = _decoded(parts[2])
        if parts[:2] == ["v2", "groups"]:
            return Route("group", group=name)
        if parts[:2] == ["v1", "requests"]:
            return Route("single", request_id=name, vllm=True)
    return None


def _decoded(segment: str) -> str:
    return unquote(segment, errors="surrogateescape")
