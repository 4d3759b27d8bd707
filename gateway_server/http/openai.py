"""The OpenAI API: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(``/v1/responses``: :mod:`gateway_server.http.responses`); anything else under ``/v1`` is 404
in OpenAI's error shape.

What each request field does is :mod:`gateway_server.openai.fields`' table; the body is read by
:mod:`gateway_server.openai.request`. Log-probabilities are rendered only for requests that ask
for them (:mod:`gateway_server.openai.logprobs`); a plain stream's events are built as below.

Streaming answers are SSE, one ``data:`` event per chunk, ending with ``data: [DONE]``. A
request cancelled while its answer streams (cancel API, shutdown) gets an error event and the
stream ends without ``[DONE]``, so a client can tell a cut answer from a complete one. That
event carries, beside ``error``, the call's ``usage`` up to the cancel (OpenAI's shape); a
stream that asked for usage (``stream_options.include_usage``) gets it first in the usage chunk
OpenAI's streams end with (``choices: []``), and only then (a client that did not ask never
gets a chunk without choices). A call that does not stream, cancelled, is answered 499 in
OpenAI's error shape with ``usage`` beside ``error``.

A chunk's event is built by :class:`StreamEvents` from parts encoded once per response: only
the chunk's text is JSON-encoded per event (one event per engine step and choice, the hottest
path of a streamed answer), and the bytes are those ``json.dumps`` of the whole chunk would give.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from dataclasses import field as dc_field
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from gateway_server import sse
from gateway_server.engine.base import FinishReason, TokenChunk, TokenLogprob
from gateway_server.engine.tools import ChoiceTools
from gateway_server.errors import (
    CancelledWhileRunning,
    GatewayError,
    MethodNotAllowed,
    PathNotFound,
    RequestCancelled,
)
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
from gateway_server.openai import logprobs as openai_logprobs
from gateway_server.openai.request import OpenAIJob, parse
from gateway_server.openai.streams import merge
from gateway_server.registry import Call
from gateway_server.requests import cancelled_message
from gateway_server.service import GenerationService


@dataclass
class _Choice:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    tokens: int = 0
    logprobs: list[TokenLogprob] = dc_field(default_factory=list)
    offset: int = 0
    """Completions' streamed ``text_offset``: where the next token's text starts."""
    echoed: bool = False


@dataclass(frozen=True)
class _Answer:
    """What every event or body of one answer shares."""

    job: OpenAIJob
    created: int = dc_field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        if self.job.chat:
            return "chat.completion.chunk" if self.job.stream else "chat.completion"
        return "text_completion"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/v1/{tail:.*}", unknown_path)


async def unknown_path(request: web.Request) -> web.StreamResponse:
    """Anything else under ``/v1``: 404 (405 for a known path) in OpenAI's error shape."""
    if request.path in ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses"):
        raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    raise PathNotFound(f"{request.method} {request.path} is not an endpoint of this gateway")


async def list_models(request: web.Request) -> web.Response:
    service: GenerationService = request.app[SERVICE]
    model = {
        "id": service.model.name,
        "object": "model",
        "created": 0,
        "owned_by": "hangup",
        "max_model_len": service.model.max_model_len,
    }
    return web.json_response({"object": "list", "data": [model]})


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def _serve(request: web.Request, *, chat: bool) -> web.StreamResponse:
    service: GenerationService = request.app[SERVICE]
    request[PROTOCOL] = Protocol.OPENAI
    call_id = request_id(request)
    body = await read_json_object(request)
    if isinstance(body.get("model"), str):  # a refused request is counted under its model
        request[MODEL] = body["model"]
    job = parse(body, service, chat=chat)
    group = group_of(request, body)
    answer = _Answer(job)
    client = client_of(request)
    async with service.call(call_id, job.model, Protocol.OPENAI, client, group) as call:
        streams = [
            service.generate(call, c.prompt, c.params, bills_prompt=i % job.n == 0)
            for i, c in enumerate(job.choices)
        ]  # choices come prompt by prompt, n of each: each prompt billed once
        if job.stream:
            return await _stream(request, call, answer, merge(streams))
        return await _respond(call, answer, merge(streams))


async def _respond(
    call: Call, answer: _Answer, chunks: AsyncGenerator[tuple[int, TokenChunk], None]
) -> web.Response:
    job = answer.job
    choices = [_Choice() for _ in job.choices]
    keep_logprobs = job.top_logprobs is not None
    try:
        async with aclosing(chunks):
            async for index, chunk in chunks:
                _absorb(choices[index], chunk, keep_text=True, keep_logprobs=keep_logprobs)
    except RequestCancelled as exc:  # every engine request of the call has ended: its usage
        raise CancelledWhileRunning(exc.reason, call.usage) from exc
    body = _envelope(call, answer)
    body["choices"] = [_final_choice(job, i, c) for i, c in enumerate(choices)]
    if job.tools is not None:
        for piece, choice in zip(body["choices"], choices, strict=True):
            message, finish = job.tools.choice().message(choice.text, choice.finish_reason)
            piece["message"], piece["finish_reason"] = message, finish
    body["usage"] = _usage(job, choices)
    return web.json_response(body, headers={REQUEST_ID_HEADER: call.call_id})


async def _stream(
    request: web.Request,
    call: Call,
    answer: _Answer,
    chunks: AsyncGenerator[tuple[int, TokenChunk], None],
) -> web.StreamResponse:
    job = answer.job
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            REQUEST_ID_HEADER: call.call_id,
        }
    )
    await response.prepare(request)
    choices = [_Choice() for _ in job.choices]
    if job.chat:
        for i in range(len(choices)):
            role = {"role": "assistant", "content": ""}
            piece = {"index": i, "delta": role, "logprobs": None, "finish_reason": None}
            await response.write(_event(call, answer, [piece]))
    events = StreamEvents(_envelope(call, answer), chat=job.chat)
    plain = job.top_logprobs is None and not any(c.echo for c in job.choices)
    tools = [job.tools.choice() for _ in choices] if job.tools is not None else None
    try:
        async with aclosing(chunks):
            async for index, chunk in chunks:
                _absorb(choices[index], chunk, keep_text=False, keep_logprobs=False)
                if tools is not None:  # the tool parser decides what each delta holds
                    await _write_tool_delta(response, call, answer, index, chunk, tools[index])
                elif plain:  # the per-token path: nothing but the text is encoded per event
                    if chunk.text or chunk.finish_reason:
                        await response.write(events.chunk(index, chunk.text, chunk.finish_reason))
                elif chunk.text or chunk.finish_reason or chunk.logprobs:
                    await response.write(_rich_event(events, job, index, choices[index], chunk))
    except (RequestCancelled, GatewayError) as exc:
        await _write_end(response, call, answer, exc)
        return response
    if job.include_usage:
        usage = _envelope(call, answer) | {"choices": [], "usage": _usage(job, choices)}
        await response.write(sse.encode(json.dumps(usage)))
    await response.write(sse.encode("[DONE]"))
    await response.write_eof()
    return response


async def _write_end(
    response: web.StreamResponse,
    call: Call,
    answer: _Answer,
    exc: RequestCancelled | GatewayError,
) -> None:
    """End a stream cut by ``exc``: its error event (without ``[DONE]``); for a cancel, with
    the call's usage in it, and first in a usage chunk if the stream asked for usage."""
    end: dict[str, Any] = {"error": _error_body(exc)}
    if isinstance(exc, RequestCancelled):  # every engine request of the call has ended
        usage = call.usage.to_json()
        if answer.job.include_usage:
            chunk = _envelope(call, answer) | {"choices": [], "usage": usage}
            await response.write(sse.encode(json.dumps(chunk)))
        end["usage"] = usage
    await response.write(sse.encode(json.dumps(end)))
    await response.write_eof()


def _rich_event(
    events: StreamEvents, job: OpenAIJob, index: int, choice: _Choice, chunk: TokenChunk
) -> bytes:
    """A chunk's event carrying log-probabilities, or the echoed prompt before its first text."""
    text, tokens = chunk.text, list(chunk.logprobs or ())
    echo = job.choices[index].echo
    if echo is not None and not choice.echoed:
        choice.echoed = True
        text = echo + text
        tokens = [*(chunk.prompt_logprobs or ()), *tokens]
    top = job.top_logprobs
    if top is None:
        return events.chunk(index, text, chunk.finish_reason)
    if job.chat:
        logprobs = openai_logprobs.chat(tokens, top)
    else:
        logprobs, choice.offset = openai_logprobs.completion(tokens, top, choice.offset)
    return events.chunk(index, text, chunk.finish_reason, json.dumps(logprobs))


async def _write_tool_delta(
    response: web.StreamResponse,
    call: Call,
    answer: _Answer,
    index: int,
    chunk: TokenChunk,
    tools: ChoiceTools,
) -> None:
    """One chunk of a choice whose answer goes through the tool parser (not the per-token
    fast path: the parser decides whether the delta holds ``content`` or ``tool_calls``)."""
    finish = chunk.finish_reason.value if chunk.finish_reason else None
    if not chunk.text and finish is None:
        return
    delta = tools.delta(chunk.text, finish)
    if delta is None:
        return
    reason = tools.stream_finish(finish) if finish else None
    top = answer.job.top_logprobs
    logprobs = None if top is None else openai_logprobs.chat(list(chunk.logprobs or ()), top)
    piece = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
    await response.write(_event(call, answer, [piece]))


class StreamEvents:
    """The chunk events of one streamed answer: ``chunk(...)`` gives the bytes of
    ``sse.encode(json.dumps(envelope | {"choices": [choice]}))``, the choice being
    ``{"index", "delta": {"content": text}}`` (chat) or ``{"index", "text"}``, then
    ``"logprobs"`` (null unless given, as JSON) and the finish reason. The envelope is encoded
    once, here."""

    def __init__(self, envelope: dict[str, Any], *, chat: bool) -> None:
        opened = json.dumps(envelope)[:-1]  # without its closing brace: the choices follow
        key = "delta" if chat else "text"
        self._head = f'data: {opened}, "choices": [{{"index": '
        self._key = f', "{key}": {{"content": ' if chat else f', "{key}": '
        self._close = "}" if chat else ""
        self._finishes = {
            reason: f', "finish_reason": {json.dumps(reason and reason.value)}}}]}}\n\n'
            for reason in (None, *FinishReason)
        }
        self._tails = {r: ', "logprobs": null' + tail for r, tail in self._finishes.items()}

    def chunk(
        self, index: int, text: str, finish: FinishReason | None, logprobs: str | None = None
    ) -> bytes:
        tail = (
            self._tails[finish]
            if logprobs is None
            else (f', "logprobs": {logprobs}{self._finishes[finish]}')
        )
        return (
            f"{self._head}{index}{self._key}{encode_basestring_ascii(text)}{self._close}{tail}"
        ).encode()


def _absorb(choice: _Choice, chunk: TokenChunk, *, keep_text: bool, keep_logprobs: bool) -> None:
    if keep_text:
        choice.text += chunk.text
    if keep_logprobs:
        choice.logprobs.extend(chunk.prompt_logprobs or ())  # only on the first chunk
        choice.logprobs.extend(chunk.logprobs or ())
    choice.tokens += chunk.new_tokens
    choice.prompt_tokens = chunk.prompt_tokens
    if chunk.finish_reason is not None:
        choice.finish_reason = chunk.finish_reason.value


def _envelope(call: Call, answer: _Answer) -> dict[str, Any]:
    prefix = "chatcmpl" if answer.job.chat else "cmpl"
    return {
        "id": f"{prefix}-{call.call_id}",
        "object": answer.object_name,
        "created": answer.created,
        "model": answer.job.model,
    }


def _event(call: Call, answer: _Answer, choices: list[dict[str, Any]]) -> bytes:
    return sse.encode(json.dumps(_envelope(call, answer) | {"choices": choices}))


def _final_choice(job: OpenAIJob, index: int, choice: _Choice) -> dict[str, Any]:
    top = job.top_logprobs
    if job.chat:
        message = {"role": "assistant", "content": choice.text}
        logprobs = None if top is None else openai_logprobs.chat(choice.logprobs, top)
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }
    text = (job.choices[index].echo or "") + choice.text
    logprobs = None if top is None else openai_logprobs.completion(choice.logprobs, top, 0)[0]
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
    }


def _usage(job: OpenAIJob, choices: list[_Choice]) -> dict[str, int]:
    prompt = sum(c.prompt_tokens for c in choices[:: job.n])  # each prompt once, not n times
    completion = sum(c.tokens for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error_body(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, RequestCancelled):
        return {"message": cancelled_message(exc.reason), "type": "cancelled", "code": 499}
    assert isinstance(exc, GatewayError)
    return {"message": exc.message, "type": exc.error_type, "code": exc.status}
