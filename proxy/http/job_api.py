"""The proxy's cancel API for jobs (``hangup_contract.jobs``, issue 66): a group of calls, a
batch of ids, and the list of the calls held; the routes and token are ``proxy.http.cancel_api``'s.

- **A group** (``POST /v2/groups/{group}/cancel``): every worker ends the calls of the group it
  holds, as a cancel by id ends one, and refuses the group's calls that arrive within
  ``--tombstone-ttl``. With the ``hangup`` adapter the gateway is asked first (its calls tagged
  by the body's ``metadata.hangup_group``, which the sidecar does not read; and the calls that
  reach it another way), and its entries (phase, tokens, legs) replace the sidecar's for the
  same id; when it fails, the answer carries its error as ``upstream_error`` beside what the
  sidecar ended. 200 with each call's entry; a group nobody holds answers an empty list (and
  is refused for the ttl all the same).
- **A batch** (``POST /v2/requests/cancel``, ``POST /v1/requests/cancel``): each id as one cancel
  by id is answered, all at once; the ids nobody here holds are asked of the gateway in one
  batch (``hangup``), else each is buried in every worker and answered ``not_found``.
- **The list** (``GET /v2/sidecar/requests``, ``?group=``): the calls every worker holds,
  ``{"requests": [...], "truncated"}``, at most ``LIST_MOST`` (and what fits in a worker's
  line of the sibling channel), each with its ids, group, model and path (its first 200
  characters), stage, whether it streams and its age.

Each answered call is counted by kind (``hangup_proxy_cancel_api_calls_total``), each id by what
it found (``hangup_proxy_cancel_api_ids_total``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs

from hangup_contract import jobs
from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import CancelKind
from proxy.calls.held import HeldCalls
from proxy.calls.siblings import Siblings, group_entry
from proxy.calls.state import LIST_MOST
from proxy.errors import UpstreamError
from proxy.messages import Answer, error_answer
from proxy.metrics import ProxyMetrics

Post = Callable[[str, bytes, int], Awaitable[tuple[int, bytes]]]
"""The proxy's own POST to the gateway's cancel API: a path, a body, the most of an answer to
read; the answer as it came (``HttpCancelAdapter.forward``)."""
JOB_ANSWER_LIMIT = 8 << 20  # bytes of a gateway's group or batch answer read at most
Entry = dict[str, Any]


class Cancels(Protocol):
    """What the job routes use of the cancel API (``CancelById``)."""

    held: HeldCalls
    siblings: Siblings | None
    post: Post | None
    metrics: ProxyMetrics
    max_batch_ids: int
    listing: Callable[[str | None], list[dict[str, object]]]

    async def cancel(self, request_id: str) -> str | None: ...

    async def bury(self, request_id: str) -> None: ...


def json_answer(status: int, body: object) -> Answer:
    return Answer(status, json.dumps(body).encode(), content_type="application/json")


async def group(api: Cancels, name: str, reason: Reason) -> Answer:
    """End every call of group ``name``: at the gateway first (``hangup``: it sees the engine,
    its entries say where each call was), then in every worker."""
    try:
        checked = jobs.check_group(name)
    except ValueError as exc:
        return error_answer(400, str(exc))
    assert checked is not None
    upstream: list[Entry] | Answer = []
    if api.post is not None:
        path = jobs.GROUP_ROUTE.format(group=checked)
        upstream = await _forwarded(api.post, path, json.dumps({"reason": reason.value}))
    ended = await api.held.cancel_group(checked)
    entries: list[Entry] = [group_entry(call, state) for call, state in ended]
    more = 0
    if api.siblings is not None:
        theirs, more = await api.siblings.entries("cancel_group", checked)
        entries.extend(theirs)
    if isinstance(upstream, Answer):  # the gateway's part failed: said beside the sidecar's
        answer = jobs.job_answer(entries, checked)
        body = upstream.body.decode(errors="replace")
        answer["upstream_error"] = {"status": upstream.status, "body": body}
    else:
        answer = jobs.job_answer(_merged(entries, upstream), checked)
    if more:  # cancelled, but past what a worker's answer line holds
        answer["more_results"] = more
    api.metrics.cancel_answered(CancelKind.GROUP, [str(e.get("state")) for e in answer["results"]])
    return json_answer(200, answer)


async def batch(api: Cancels, body: bytes, *, vllm: bool) -> Answer:
    """Cancel each id of a batch body, as one cancel by id is (``vllm``: the PR's path, whose
    answer is the same)."""
    try:
        parsed = jobs.parse_batch(body, api.max_batch_ids)
    except ValueError as exc:
        return error_answer(400, str(exc))
    ids = parsed.request_ids
    states = await asyncio.gather(*(api.cancel(i) for i in ids))
    entries: dict[str, Entry] = {
        i: {"request_id": i, "state": s} for i, s in zip(ids, states, strict=True) if s
    }
    missing = [i for i in ids if i not in entries]
    if missing and api.post is not None:
        upstream = await _forwarded(
            api.post, jobs.BATCH_ROUTE, jobs.encode_batch(missing, parsed.reason).decode()
        )
        if isinstance(upstream, Answer):
            return upstream
        entries |= {e["request_id"]: e for e in upstream if e["request_id"] in missing}
    else:
        await asyncio.gather(*(api.bury(i) for i in missing))
    answered = [entries.get(i) or jobs.not_found(i) for i in ids]
    api.metrics.cancel_answered(CancelKind.BATCH, [str(e["state"]) for e in answered])
    return json_answer(200, jobs.job_answer(answered))


async def listing(api: Cancels, target: str) -> Answer:
    """Every worker's calls (of the group ``?group=`` names in ``target``, if any), at most
    ``LIST_MOST``."""
    group_name = parse_qs(target.partition("?")[2]).get("group", [None])[0]
    calls = api.listing(group_name)
    more = 0
    if api.siblings is not None:
        theirs, more = await api.siblings.entries("list", group_name or "")
        calls.extend(theirs)
    truncated = more > 0 or len(calls) > LIST_MOST
    return json_answer(200, {"requests": calls[:LIST_MOST], "truncated": truncated})


async def _forwarded(post: Post, path: str, body: str) -> list[Entry] | Answer:
    """The gateway's entries for a group or batch (the proxy's own call), or the answer to give
    when it did not answer with them (its error, passed on)."""
    try:
        status, answer = await post(path, body.encode(), JOB_ANSWER_LIMIT)
    except UpstreamError as exc:
        return error_answer(exc.status, exc.message)
    if status != 200:
        return Answer(status, answer, content_type="application/json")
    try:
        return jobs.answer_entries(answer)
    except ValueError as exc:
        return error_answer(502, f"the gateway's answer is not a job answer: {exc}")


def _merged(here: list[Entry], upstream: list[Entry]) -> list[Entry]:
    """The sidecar's entries and the gateway's, one per id: the gateway's where both name one
    (it saw the engine: phase, tokens, legs)."""
    theirs = {e["request_id"]: e for e in upstream}
    merged = [theirs.pop(e["request_id"], e) for e in here]
    return merged + list(theirs.values())
