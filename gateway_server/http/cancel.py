"""The cancel API over HTTP: ``POST /v2/requests/{id}/cancel`` (the contract's route and bodies,
``hangup_contract.cancel``) and ``GET /v2/requests``, behind the bearer token when the gateway
has one (docs/gateway.md, "The cancel API"; without one the gateway serves them only on
loopback). The id to cancel keeps the cancel rule (``hangup_contract.request_id.is_cancel_id``)
or is refused with 400 before it is looked up, forwarded or kept as a tombstone."""

from __future__ import annotations

from aiohttp import web

from gateway_server.errors import InvalidRequest, Unauthorized
from gateway_server.http.common import CANCEL_TOKEN, SERVICE, read_body
from gateway_server.service import GenerationService
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import ROUTE, bearer_matches, parse_request


def add_routes(app: web.Application) -> None:
    app.router.add_post(ROUTE, cancel)
    app.router.add_get("/v2/requests", list_requests)


def check_token(request: web.Request) -> None:
    """Raise Unauthorized unless the request carries the configured bearer token (if any)."""
    token = request.app.get(CANCEL_TOKEN)
    if token is None:
        return
    if not bearer_matches(request.headers.get("Authorization"), token):
        raise Unauthorized("the cancel API needs 'Authorization: Bearer <token>'")


async def cancel(request: web.Request) -> web.Response:
    """Cancel a call by id. 200 cancelled|finished, 404 never seen (a tombstone is left)."""
    check_token(request)
    service: GenerationService = request.app[SERVICE]
    try:
        reason = parse_request(await read_body(request))
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    answer = await service.cancel(cancel_id(request.match_info["request_id"]), reason)
    return web.json_response(answer.to_json())


def cancel_id(given: str) -> str:
    """``given`` if it may name a call or a stream request (``hangup_contract.request_id``'s
    cancel rule), else InvalidRequest: nothing longer is looked up, forwarded or remembered."""
    if not request_ids.is_cancel_id(given):
        raise InvalidRequest(f"the id to cancel must be {request_ids.CANCEL_RULE}")
    return given


async def list_requests(request: web.Request) -> web.Response:
    check_token(request)
    service: GenerationService = request.app[SERVICE]
    return web.json_response({"requests": await service.all_calls()})
