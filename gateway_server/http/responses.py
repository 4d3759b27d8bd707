"""The Responses API over HTTP: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``. The routes; how a response runs is the
runner's (:mod:`gateway_server.openai.responses.runner`).

What each kind of response is to its client (docs/openai.md, "The Responses API"):

- synchronous and streaming: the handler runs the call under the request's ``X-Request-Id``
  (the proxy's id), as a chat completion does: a client that hangs up, or the proxy's cancel of
  that id, cancels it (``client_disconnect``).
- background: a task of the gateway's runs it as a call of its own, under a fresh id; the
  POST answers at once (or, streaming, follows the task's events), so a client that hangs up on
  the POST or on a resumed ``GET ...?stream=true`` stops only its own reading, and the proxy's
  cancel of the POST's or the GET's id reaches no engine request. Only its cancel (or the cancel
  API with its call id, or shutdown) stops it.

Every response's id is the gateway's own, random (``resp_`` and 32 hex digits; a background
response's call id is those digits), never made from a client's header: the routes below act
only on the response record an id names. ``POST /v1/responses/{id}/cancel`` cancels that
record's call (reason ``explicit``), then answers the response object once it ended; an id that
names no response is 404 and leaves nothing behind.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from aiohttp import web

from gateway_server.errors import InvalidRequest
from gateway_server.http.common import (
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
    client_of,
    group_of,
    read_json_object,
    request_id,
)
from gateway_server.labels import Protocol
from gateway_server.openai.responses.objects import encode
from gateway_server.openai.responses.request import ResponsesJob, read
from gateway_server.openai.responses.runner import ResponsesRunner, followed, new_record
from gateway_server.openai.responses.store import ResponseRecord
from gateway_server.registry import Call
from gateway_server.service import GenerationService
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")

RUNNER = web.AppKey("responses", ResponsesRunner)
_SEQUENCE_NUMBER = re.compile(r"-1|[0-9]{1,18}")
"""``starting_after``: -1 (every event) or an event's number, in ASCII digits."""
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def add_routes(app: web.Application, runner: ResponsesRunner) -> None:
    """Before the OpenAI routes (their catch-all answers 404 under ``/v1``)."""
    app[RUNNER] = runner
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)


async def create(request: web.Request) -> web.StreamResponse:
    service: GenerationService = request.app[SERVICE]
    runner = request.app[RUNNER]
    store = runner.store
    request[PROTOCOL] = Protocol.OPENAI
    call_id = request_id(request)
    body = await read_json_object(request)
    if isinstance(body.get("model"), str):  # a refused request is counted under its model
        request[MODEL] = body["model"]
    job = read(body, service, await runner.earlier(body.get("previous_response_id")))
    group = group_of(request, body)
    if job.background:
        return await _background(request, runner, job, call_id, group)
    client = client_of(request)
    record = new_record(job, call_id, runner.fresh_id(), client)
    headers = {REQUEST_ID_HEADER: call_id}
    async with service.call(call_id, job.model, Protocol.OPENAI, client, group) as call:
        store.start(record)
        try:
            if job.stream:
                return await _stream(request, runner, call, record, job, headers)
            await runner.run(call, record, job, None)
        finally:
            store.finish(record)
    return web.json_response(record.answer.to_json(), headers=headers)


async def retrieve(request: web.Request) -> web.StreamResponse:
    """The response object; with ``?stream=true`` (background responses), its events after
    ``starting_after`` (default: all), then each new one until the last. Wherever it is held
    (with API processes, its home is asked)."""
    runner, response_id = request.app[RUNNER], request.match_info["response_id"]
    if request.query.get("stream", "false").lower() not in ("true", "1"):
        return web.json_response(await runner.retrieve(response_id))
    after = sequence_number(request.query.get("starting_after", "-1"))
    events = await runner.events(response_id, after)
    return await _relay(request, events, {REQUEST_ID_HEADER: request_id(request)})


async def delete(request: web.Request) -> web.Response:
    """Forget a stored response, wherever it is held. 400 while it runs (cancel it first),
    404 unknown."""
    return web.json_response(await request.app[RUNNER].delete(request.match_info["response_id"]))


async def cancel(request: web.Request) -> web.Response:
    """Cancel a response in flight (background, synchronous or streaming; its call, reason
    ``explicit``); answer its object once it ended. Idempotent: an ended one answers its final
    status. 404 for an id that names no response here (or, with API processes, at its home),
    and for a ``store: false`` response that ended."""
    answer = await request.app[RUNNER].cancel(request.match_info["response_id"])
    return web.json_response(answer)


async def _stream(
    request: web.Request,
    runner: ResponsesRunner,
    call: Call,
    record: ResponseRecord,
    job: ResponsesJob,
    headers: dict[str, str],
) -> web.StreamResponse:
    response = web.StreamResponse(headers=_SSE_HEADERS | headers)
    await response.prepare(request)

    async def write(events: list[dict[str, Any]]) -> None:
        await response.write(b"".join(encode(e) for e in events))

    await write([record.events.created()])
    await runner.run(call, record, job, write)
    await response.write_eof()
    return response


async def _background(
    request: web.Request,
    runner: ResponsesRunner,
    job: ResponsesJob,
    post_id: str,
    group: str | None,
) -> web.StreamResponse:
    record = await runner.start_background(job, client_of(request), group)
    log_event(
        log,
        "response_background",
        request_id=post_id,
        call_id=record.call_id,
        response_id=record.id,
    )
    headers = {REQUEST_ID_HEADER: post_id}
    if job.stream:
        return await _relay(request, followed(record, -1), headers)
    return web.json_response(record.answer.to_json(), headers=headers)


async def _relay(
    request: web.Request, events: AsyncGenerator[bytes, None], headers: dict[str, str]
) -> web.StreamResponse:
    """Relay a background response's events; a client leaving stops only this relay."""
    response = web.StreamResponse(headers=_SSE_HEADERS | headers)
    await response.prepare(request)
    async with aclosing(events):
        async for chunk in events:
            await response.write(chunk)
    await response.write_eof()
    return response


# -- ids and records ---------------------------------------------------------------------------


def sequence_number(raw: str) -> int:
    """``starting_after`` read: -1 (every event) or an event's number, in ASCII digits (at most
    18). Raises InvalidRequest naming it."""
    if not _SEQUENCE_NUMBER.fullmatch(raw):
        raise InvalidRequest("'starting_after' must be a sequence number", param="starting_after")
    return int(raw)
