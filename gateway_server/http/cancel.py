"""The cancel API over HTTP, behind the bearer token when the gateway has one (docs/gateway.md,
"The cancel API"; without one the gateway serves it only on loopback):

- ``POST /v2/requests/{id}/cancel``: one call (the contract's route and bodies,
  ``hangup_contract.cancel``), by its id, a stream request's alias, its answer's own id
  (``chatcmpl-…``, ``cmpl-…``) or a response's (``resp_…``);
- ``POST /v2/groups/{group}/cancel`` and ``POST /v2/requests/cancel`` (``{"request_ids"}``):
  every call of a job, a batch of ids (``hangup_contract.jobs``), each answered;
- vLLM PR 55521's paths: ``POST /v1/requests/{id}/cancel``, ``DELETE /v1/requests/{id}`` (200
  for a call cancelled, 404 in OpenAI's shape for one not in flight) and ``POST
  /v1/requests/cancel`` (the batch);
- ``GET /v2/requests`` (``?group=`` keeps one group's): the calls in flight.

An id to cancel keeps the cancel rule (``hangup_contract.request_id.is_cancel_id``) and a group
the id rule, or the call is refused with 400 before anything is looked up, forwarded or kept.
Each answered call is counted by kind (``hangup_gateway_cancel_api_calls_total``), each id by
what it found (``hangup_gateway_cancel_api_ids_total``).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from gateway_server.errors import InvalidRequest, RequestNotFound, Unauthorized
from gateway_server.groups import describe_filter
from gateway_server.http.common import CANCEL_TOKEN, MAX_BATCH_IDS, SERVICE, read_body
from gateway_server.http.responses import RUNNER
from gateway_server.openai.responses.objects import Status
from gateway_server.openai.responses.runner import PREFIX as RESPONSE_PREFIX
from gateway_server.service import GenerationService
from hangup_contract import jobs
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import ROUTE, CancelAnswer, bearer_matches, parse_request
from hangup_contract.cancel_labels import CancelState, Reason
from hangup_contract.jobs import CancelKind


def add_routes(app: web.Application) -> None:
    app.router.add_post(ROUTE, cancel)
    app.router.add_post(jobs.BATCH_ROUTE, cancel_batch)
    app.router.add_post(jobs.GROUP_ROUTE, cancel_group)
    app.router.add_get("/v2/requests", list_requests)


def add_vllm_routes(app: web.Application) -> None:
    """vLLM PR 55521's paths (before the OpenAI API's catch-all under ``/v1``)."""
    app.router.add_post(jobs.VLLM_BATCH_ROUTE, cancel_batch)
    app.router.add_post(jobs.VLLM_CANCEL_ROUTE, cancel_as_vllm)
    app.router.add_delete(jobs.VLLM_DELETE_ROUTE, cancel_as_vllm)


def check_token(request: web.Request) -> None:
    """Raise Unauthorized unless the request carries the configured bearer token (if any)."""
    token = request.app.get(CANCEL_TOKEN)
    if token is None:
        return
    if not bearer_matches(request.headers.get("Authorization"), token):
        raise Unauthorized("the cancel API needs 'Authorization: Bearer <token>'")


async def cancel(request: web.Request) -> web.Response:
    """Cancel a call by id. 200 cancelled|finished, 404 never seen (a tombstone is left)."""
    answer = await _single(request, await _reason(request))
    return web.json_response(answer.to_json())


async def cancel_as_vllm(request: web.Request) -> web.Response:
    """PR 55521's single cancel: 200 ``{"status": "cancelled", ...}`` for a call it cancelled,
    404 for one that had ended or was never seen (the PR's "not active / already
    completed")."""
    answer = await _single(request, await _reason(request))
    if answer.state is not CancelState.CANCELLED:
        raise RequestNotFound(f"request {answer.request_id!r} is not in flight: it has ended")
    return web.json_response({"status": "cancelled", **answer.to_json()})


async def _single(request: web.Request, reason: Reason) -> CancelAnswer:
    service: GenerationService = request.app[SERVICE]
    request_id = cancel_id(request.match_info["request_id"])
    try:
        answer = await cancel_one(request, request_id, reason)
    except RequestNotFound:
        service.metrics.cancel_answered(CancelKind.SINGLE, [jobs.NOT_FOUND])
        raise
    service.metrics.cancel_answered(CancelKind.SINGLE, [answer.state.value])
    return answer


async def cancel_one(request: web.Request, request_id: str, reason: Reason) -> CancelAnswer:
    """Cancel what ``request_id`` names: a response (``resp_…``, the record it names), else a
    call or stream request (the service's cancel). Raises RequestNotFound."""
    if request_id.startswith(RESPONSE_PREFIX):
        with contextlib.suppress(RequestNotFound):  # else: a call whose own id has the prefix
            answer = await request.app[RUNNER].cancel(request_id)
            usage = answer.get("usage") or {}
            tokens = int(usage.get("output_tokens", 0))
            state = CancelState.CANCELLED if answer.get("status") == Status.CANCELLED else None
            return CancelAnswer(request_id, state or CancelState.FINISHED, None, tokens)
    service: GenerationService = request.app[SERVICE]
    return await service.cancel(request_id, reason)


async def cancel_batch(request: web.Request) -> web.Response:
    """Cancel each id of ``{"request_ids": [...]}``; 200 with each one's answer."""
    check_token(request)
    service: GenerationService = request.app[SERVICE]
    try:
        batch = jobs.parse_batch(await read_body(request), request.app[MAX_BATCH_IDS])
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    entries = await asyncio.gather(*(_entry(request, i, batch.reason) for i in batch.request_ids))
    service.metrics.cancel_answered(CancelKind.BATCH, [str(e["state"]) for e in entries])
    return web.json_response(jobs.job_answer(entries))


async def _entry(request: web.Request, request_id: str, reason: Reason) -> dict[str, object]:
    try:
        return (await cancel_one(request, request_id, reason)).to_json()
    except RequestNotFound:
        return jobs.not_found(request_id)


async def cancel_group(request: web.Request) -> web.Response:
    """Cancel every call of the group, in every API process; 200 with each call's answer
    (none: the group's calls that arrive within the tombstone ttl are refused all the same)."""
    reason = await _reason(request)
    service: GenerationService = request.app[SERVICE]
    try:
        group = jobs.check_group(request.match_info["group"])
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    assert group is not None
    entries = await service.cancel_group(group, reason)
    service.metrics.cancel_answered(CancelKind.GROUP, [str(e["state"]) for e in entries])
    return web.json_response(jobs.job_answer(entries, group))


async def _reason(request: web.Request) -> Reason:
    """The token checked, the body's reason (``explicit`` without one)."""
    check_token(request)
    try:
        return parse_request(await read_body(request))
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc


def cancel_id(given: str) -> str:
    """``given`` if it may name a call or a stream request (``hangup_contract.request_id``'s
    cancel rule), else InvalidRequest: nothing longer is looked up, forwarded or remembered."""
    if not request_ids.is_cancel_id(given):
        raise InvalidRequest(f"the id to cancel must be {request_ids.CANCEL_RULE}")
    return given


async def list_requests(request: web.Request) -> web.Response:
    check_token(request)
    service: GenerationService = request.app[SERVICE]
    keep = describe_filter(request.query.get("group"))
    return web.json_response({"requests": [c for c in await service.all_calls() if keep(c)]})
