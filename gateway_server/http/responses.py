"""The Responses API over HTTP: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``.

How each kind of response runs (README, "The Responses API"):

- synchronous and streaming: the handler runs the call under the request's ``X-Request-Id``
  (the proxy's id), as a chat completion does: a client that hangs up, or the proxy's cancel of
  that id, cancels it (``client_disconnect``). Its id is ``resp_<call id>``.
- background: a task of the gateway's runs it as a call of its own, under a fresh id; the
  POST answers at once (or, streaming, follows the task's events), so a client that hangs up on
  the POST or on a resumed ``GET ...?stream=true`` stops only its own reading, and the proxy's
  cancel of the POST's or the GET's id reaches no engine request. Its id is ``resp_<its call
  id>``; only its cancel (or the cancel API with that call id, or shutdown) stops it.

``POST /v1/responses/{id}/cancel`` is the cancel API's cancel of the response's call (reason
``explicit``), then answers the response object once it ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from gateway_server.engine.base import FinishReason
from gateway_server.errors import (
    GatewayError,
    InvalidRequest,
    RequestCancelled,
    RequestNotFound,
)
from gateway_server.http.common import (
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
    read_json_object,
    request_id,
)
from gateway_server.openai.responses.objects import Answer, Status, encode
from gateway_server.openai.responses.request import ResponsesJob, read
from gateway_server.openai.responses.store import ResponseRecord, ResponseStore
from gateway_server.registry import Call
from gateway_server.service import GenerationService
from gateway_server.vocabulary import Protocol
from hangup_contract import request_id as request_ids
from hangup_contract.runtime.logs import log_event
from hangup_contract.vocabulary import CancelState, Reason

log = logging.getLogger("hangup.gateway")

RESPONSES = web.AppKey("responses", ResponseStore)
PREFIX = "resp_"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

Emit = Callable[[list[dict[str, Any]]], Awaitable[None]]


def add_routes(app: web.Application, store: ResponseStore) -> None:
    """Before the OpenAI routes (their catch-all answers 404 under ``/v1``)."""
    app[RESPONSES] = store
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
    app.on_cleanup.append(_stop_background)


async def create(request: web.Request) -> web.StreamResponse:
    service: GenerationService = request.app[SERVICE]
    store = request.app[RESPONSES]
    request[PROTOCOL] = Protocol.OPENAI
    call_id = request_id(request)
    body = await read_json_object(request)
    if isinstance(body.get("model"), str):  # a refused request is counted under its model
        request[MODEL] = body["model"]
    job = read(body, service, _earlier(store, body.get("previous_response_id")))
    if job.background:
        return await _background(request, service, store, job, call_id)
    record = _record(job, call_id)
    headers = {REQUEST_ID_HEADER: call_id}
    async with service.call(call_id, job.model, Protocol.OPENAI) as call:
        store.start(record)
        try:
            if job.stream:
                return await _stream(request, service, call, record, job, headers)
            await _run(service, call, record, job, None)
        finally:
            store.finish(record)
    return web.json_response(record.answer.to_json(), headers=headers)


async def retrieve(request: web.Request) -> web.StreamResponse:
    """The response object; with ``?stream=true`` (background responses), its events after
    ``starting_after`` (default: all), then each new one until the last."""
    record = _stored(request)
    if request.query.get("stream", "false").lower() not in ("true", "1"):
        return web.json_response(record.answer.to_json())
    if not record.background:
        raise InvalidRequest("only background responses can be streamed again", param="stream")
    raw = request.query.get("starting_after", "-1")
    after = int(raw) if raw.removeprefix("-").isdigit() else -2
    if after < -1:
        raise InvalidRequest("'starting_after' must be a sequence number", param="starting_after")
    return await _follow(request, record, after, {REQUEST_ID_HEADER: request_id(request)})


async def delete(request: web.Request) -> web.Response:
    """Forget a stored response. 400 while it runs (cancel it first), 404 unknown."""
    record = _stored(request)
    if not record.ended:
        raise InvalidRequest(
            f"response {record.id} is {record.answer.status}: cancel it before deleting it"
        )
    request.app[RESPONSES].delete(record.id)
    return web.json_response({"id": record.id, "object": "response", "deleted": True})


async def cancel(request: web.Request) -> web.Response:
    """Cancel any response in flight (background, synchronous or streaming) through the cancel
    API (reason ``explicit``); answer its object once it ended. Idempotent: an ended one answers
    its final status. 404 for an id never seen, or a ``store: false`` response that ended."""
    service: GenerationService = request.app[SERVICE]
    response_id = request.match_info["response_id"]
    call_id = _call_id(response_id)
    record = request.app[RESPONSES].get(response_id)
    if record is not None and record.ended:
        return web.json_response(record.answer.to_json())
    try:
        answer = await service.cancel(call_id, Reason.EXPLICIT)
    except RequestNotFound as exc:
        raise _not_found(response_id) from exc
    if record is not None:
        await record.wait_ended()  # the engine confirmed its abort: the run is ending now
        return web.json_response(record.answer.to_json())
    if answer.state is not CancelState.CANCELLED:
        raise _not_found(response_id)
    # Running in another API process (or a call of the cancel API's): what is known here.
    gone = Answer(response_id, service.model.name, {}, status=Status.CANCELLED)
    gone.output_tokens = answer.generated_tokens
    return web.json_response(gone.to_json())


# -- running a response ------------------------------------------------------------------------


async def _run(
    service: GenerationService,
    call: Call,
    record: ResponseRecord,
    job: ResponsesJob,
    emit: Emit | None,
) -> None:
    """Generate the answer into ``record``, emitting its events from ``in_progress`` on (none
    are built without ``emit``: a synchronous response). Ends with the record's final status
    (a client that left: cancelled, and the CancelledError goes on)."""
    answer, events = record.answer, record.events
    answer.status = Status.IN_PROGRESS
    finish: FinishReason | None = None
    try:
        if emit is not None:
            await emit([events.in_progress()])
        async with aclosing(service.generate(call, job.prompt, job.params)) as chunks:
            async for chunk in chunks:
                started = answer.started_output
                answer.started_output = True
                answer.input_tokens = chunk.prompt_tokens
                answer.output_tokens += chunk.new_tokens
                finish = chunk.finish_reason or finish
                answer.text += chunk.text
                if emit is not None and (chunk.text or not started):
                    new = [] if started else events.output_started()
                    await emit([*new, events.delta(chunk.text)] if chunk.text else new)
        answer.status = Status.INCOMPLETE if finish is FinishReason.LENGTH else Status.COMPLETED
    except RequestCancelled:
        answer.status = Status.CANCELLED
    except GatewayError as exc:
        answer.status = Status.FAILED
        answer.error = {"code": exc.error_type, "message": exc.message}
    finally:
        if not answer.status.ended:  # the client left (or its socket broke) mid-way
            answer.status = Status.CANCELLED
        answer.completed_at = int(time.time())
        record.turns.append({"role": "assistant", "content": answer.text})
    if emit is not None:
        await emit(events.ended())


async def _stream(
    request: web.Request,
    service: GenerationService,
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
    await _run(service, call, record, job, write)
    await response.write_eof()
    return response


async def _background(
    request: web.Request,
    service: GenerationService,
    store: ResponseStore,
    job: ResponsesJob,
    post_id: str,
) -> web.StreamResponse:
    record = _record(job, request_ids.new_request_id())
    store.start(record)
    opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    record.task = asyncio.create_task(_work(service, store, record, job, opened))
    await asyncio.shield(opened)  # a client leaving here must not cancel the work
    log_event(
        log,
        "response_background",
        request_id=post_id,
        call_id=record.call_id,
        response_id=record.id,
    )
    headers = {REQUEST_ID_HEADER: post_id}
    if job.stream:
        return await _follow(request, record, -1, headers)
    return web.json_response(record.answer.to_json(), headers=headers)


async def _work(
    service: GenerationService,
    store: ResponseStore,
    record: ResponseRecord,
    job: ResponsesJob,
    opened: asyncio.Future[None],
) -> None:
    """A background response's task: its own call; ``opened`` once it holds its id."""

    async def keep(events: list[dict[str, Any]]) -> None:
        record.emit(events)

    try:
        async with service.call(record.call_id, job.model, Protocol.OPENAI) as call:
            call.hangup_reason = Reason.SHUTDOWN  # only shutdown cancels this task
            record.emit([record.events.created(), record.events.queued()])
            opened.set_result(None)
            try:
                await _run(service, call, record, job, keep)
            finally:
                store.finish(record)
    except GatewayError as exc:  # the call did not open (draining): nothing ran
        if opened.done():
            raise
        store.forget(record)
        opened.set_exception(exc)
    finally:
        if not opened.done():
            store.forget(record)
            opened.cancel()


async def _follow(
    request: web.Request, record: ResponseRecord, after: int, headers: dict[str, str]
) -> web.StreamResponse:
    """Relay a background response's events; a client leaving stops only this relay."""
    response = web.StreamResponse(headers=_SSE_HEADERS | headers)
    await response.prepare(request)
    async for chunk in record.follow(after):
        await response.write(chunk)
    await response.write_eof()
    return response


async def _stop_background(app: web.Application) -> None:
    """At shutdown, after the drain: background responses still running end cancelled."""
    tasks = app[RESPONSES].tasks()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- ids and records ---------------------------------------------------------------------------


def _record(job: ResponsesJob, call_id: str) -> ResponseRecord:
    settings = {
        "background": job.background,
        "instructions": job.instructions,
        "max_output_tokens": job.max_output_tokens,
        "metadata": job.metadata or {},
        "previous_response_id": job.previous_response_id,
        "store": job.store,
        "temperature": job.temperature,
        "text": {"format": job.text_format},
        "top_p": job.top_p,
        "truncation": "disabled",
    }
    status = Status.QUEUED if job.background else Status.IN_PROGRESS
    answer = Answer(PREFIX + call_id, job.model, settings, status=status)
    return ResponseRecord(answer, call_id, job.store, job.background, list(job.turns))


def _call_id(response_id: str) -> str:
    """The id of the call a response id names. Raises RequestNotFound when it names none."""
    call_id = response_id.removeprefix(PREFIX)
    if call_id == response_id or not request_ids.is_valid(call_id):
        raise _not_found(response_id)
    return call_id


def _stored(request: web.Request) -> ResponseRecord:
    response_id = request.match_info["response_id"]
    record = request.app[RESPONSES].get(response_id)
    if record is None or not record.store:  # store: false: held only to be cancelled
        raise _not_found(response_id)
    return record


def _earlier(store: ResponseStore, previous: object) -> list[dict[str, Any]] | None:
    """The turns a ``previous_response_id`` continues. Raises RequestNotFound or
    InvalidRequest naming the field."""
    if previous is None:
        return None
    if not isinstance(previous, str):
        message = "'previous_response_id' must be a string"
        raise InvalidRequest(message, param="previous_response_id")
    record = store.get(previous)
    if record is None or not record.store:
        raise RequestNotFound(
            f"no stored response with id {previous!r}", param="previous_response_id"
        )
    if not record.ended:
        raise InvalidRequest(
            f"response {previous} is still {record.answer.status}: wait for it to end",
            param="previous_response_id",
        )
    return list(record.turns)


def _not_found(response_id: str) -> RequestNotFound:
    return RequestNotFound(
        f"no response with id {response_id!r} is in flight or stored here", param="response_id"
    )
