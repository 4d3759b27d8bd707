"""Assembles the gateway's aiohttp application: routes, error rendering, ``/metrics``.

Errors: handlers raise :mod:`gateway_server.errors`; one middleware renders them, in the OpenAI
error shape under ``/v1`` and as ``{"error": message}`` (KServe / Triton) elsewhere, and counts
refused generation requests as ``outcome="rejected"``. No middleware here wraps the response
body: a client disconnect reaches the handler as a cancellation (``handler_cancellation``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway_server.errors import (
    CancelledBeforeArrival,
    CancelledWhileRunning,
    ClientError,
    GatewayError,
    Unavailable,
)
from gateway_server.http import cancel, faults, kserve, openai
from gateway_server.http import responses as http_responses
from gateway_server.http.common import (
    BODY_TIMEOUT,
    CANCEL_TOKEN,
    MAX_BATCH_IDS,
    MAX_BODY_BYTES,
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
)
from gateway_server.openai.responses.runner import ResponsesRunner
from gateway_server.service import GenerationService
from hangup_contract.jobs import MAX_BATCH_IDS as MAX_BATCH

Exposition = Callable[[], Awaitable[bytes]]
"""The ``/metrics`` body: this gateway's metrics (every API process's, with several)."""
METRICS = web.AppKey[Any]("metrics")
POOL_METRICS = web.AppKey[Any]("pool_metrics")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    service: GenerationService,
    metrics: Exposition,
    *,
    pool_metrics: Exposition,
    cancel_token: str | None,
    max_body_bytes: int,
    body_timeout: float,
    responses: ResponsesRunner,
    sim_faults: bool = False,
    max_batch_ids: int = MAX_BATCH,
) -> web.Application:
    """``metrics``: the whole of ``/metrics``; ``pool_metrics``: ``/metrics/pool``, only the
    Endpoint Picker's gauges (``gateway_server.metrics.pool``), cheap enough to scrape every
    50 ms. ``sim_faults``: serve the simulated engine's fault switch (``.faults``).
    ``responses``: what runs the Responses API's responses (the server stops it).
    ``max_batch_ids``: ids one batch cancel may name (``--max-batch-ids``)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors])
    app[SERVICE] = service
    if cancel_token is not None:
        app[CANCEL_TOKEN] = cancel_token
    app[MAX_BODY_BYTES] = max_body_bytes
    app[BODY_TIMEOUT] = body_timeout
    app[MAX_BATCH_IDS] = max_batch_ids
    app[METRICS] = metrics
    app[POOL_METRICS] = pool_metrics
    http_responses.add_routes(app, responses)
    cancel.add_vllm_routes(app)  # before the OpenAI API's catch-all under /v1
    openai.add_routes(app)
    kserve.add_routes(app)
    cancel.add_routes(app)
    if sim_faults:
        faults.add_routes(app)
    app.router.add_get("/metrics", _exposition(METRICS))
    app.router.add_get("/metrics/pool", _exposition(POOL_METRICS))
    kserve.add_unknown_paths(app)  # last: what no route above took
    return app


def _exposition(key: web.AppKey[Any]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return _prometheus_text(await request.app[key]())

    return handler


def _prometheus_text(body: bytes) -> web.Response:
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as exc:
        protocol = request.get(PROTOCOL)
        refused = isinstance(exc, ClientError | Unavailable) and not isinstance(
            exc, CancelledBeforeArrival
        )
        if protocol is not None and refused:
            service: GenerationService = request.app[SERVICE]
            service.record_rejected(request.get(MODEL), protocol)
        return error_response(request, exc)


def error_response(request: web.Request, exc: GatewayError) -> web.Response:
    if request.path.startswith("/v1/"):
        error = {
            "message": exc.message,
            "type": exc.error_type,
            "param": exc.param,
            "code": exc.status,
        }
        body: dict[str, object] = {"error": error}
    else:
        body = {"error": exc.message}
    if isinstance(exc, CancelledWhileRunning) and exc.usage is not None:
        # What the call consumed up to the cancel: OpenAI's usage, or KServe's parameters.
        usage = exc.usage.to_json()
        body["usage" if request.path.startswith("/v1/") else "parameters"] = usage
    headers = {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="hangup-cancel"'
    if REQUEST_ID_HEADER in request.headers:
        headers[REQUEST_ID_HEADER] = request.headers[REQUEST_ID_HEADER]
    if request.path.startswith("/v1/"):
        response = web.json_response(body, status=exc.status, headers=headers)
    else:  # KServe / Triton: compact, as Triton writes it
        response = kserve.json_answer(body, status=exc.status, headers=headers)
    if exc.status in (408, 413):  # the rest of the body stays unread: close, do not drain it
        response.force_close()
    return response
