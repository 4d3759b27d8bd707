"""The OpenAI API: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

Streaming answers are SSE, one ``data:`` event per chunk, ending with ``data: [DONE]``. A
request cancelled while its answer streams (cancel API, shutdown) gets an error event and the
stream ends without ``[DONE]``, so a client can tell a cut answer from a complete one.

A chunk's event is built by :class:`StreamEvents` from parts encoded once per response: only
the chunk's text is JSON-encoded per event (one event per engine step and choice, the hottest
path of a streamed answer), and the bytes are those ``json.dumps`` of the whole chunk would give.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from gateway_server import sse
from gateway_server.engine.base import FinishReason, SamplingParams, TokenChunk
from gateway_server.errors import (
    CancelledWhileRunning,
    GatewayError,
    InvalidRequest,
    RequestCancelled,
)
from gateway_server.http.common import (
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
    read_json_object,
    request_id,
)
from gateway_server.registry import Call
from gateway_server.requests import MAX_CHOICES, cancelled_message, field, sampling_params
from gateway_server.service import GenerationService
from gateway_server.streams import merge
from gateway_server.structured import parse_structured
from gateway_server.tool_calls import ChoiceTools, ToolPlan
from gateway_server.vocabulary import Protocol

_ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class _Job:
    chat: bool
    model: str
    prompts: list[str]
    params: SamplingParams
    stream: bool
    include_usage: bool
    n: int = 1
    tools: ToolPlan | None = None
    """Set when the request names tools (see :mod:`gateway_server.tool_calls`)."""
    created: int = dc_field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        if self.chat:
            return "chat.completion.chunk" if self.stream else "chat.completion"
        return "text_completion"


@dataclass
class _Choice:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    tokens: int = 0


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)


async def list_models(request: web.Request) -> web.Response:
    service: GenerationService = request.app[SERVICE]
    model = {"id": service.model.name, "object": "model", "created": 0, "owned_by": "hangup",
             "max_model_len": service.model.max_model_len}  # fmt: skip
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
    job = _parse(service, body, chat=chat)
    request[MODEL] = job.model
    async with service.call(call_id, job.model, Protocol.OPENAI) as call:
        streams = [service.generate(call, p, job.params) for p in job.prompts]
        if job.stream:
            return await _stream(request, call, job, merge(streams))
        return await _respond(call, job, merge(streams))


def _parse(service: GenerationService, body: dict[str, Any], *, chat: bool) -> _Job:
    model = field(body, "model", str, None)
    if model is None:
        raise InvalidRequest("'model' is required", param="model")
    service.check_model(model)
    structured = parse_structured(body)
    tools = service.tools.plan(body) if chat else None
    if chat:
        prompt = service.chat_prompt(_messages(body), tools.tool_dicts if tools else None)
        prompts = [prompt]
    else:
        raw = body.get("prompt")
        if isinstance(raw, str):
            prompts = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            prompts = list(raw)
        else:
            raise InvalidRequest(
                "'prompt' must be a string or a non-empty array of strings", param="prompt"
            )
    max_len = service.model.max_model_len
    params = sampling_params(
        body, max_model_len=max_len, default_max_tokens=16 if not chat else 256
    )
    if tools is not None:
        params = replace(params, skip_special_tokens=tools.skip_special_tokens)
        if tools.structured is not None:  # a named or "required" tool_choice, as vLLM does it
            structured = tools.structured
    if structured is not None:
        params = replace(params, structured=structured)
        service.check_params(params)
    for prompt in prompts:
        service.check_prompt(prompt, params)
    n = field(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES or n * len(prompts) > MAX_CHOICES:
        raise InvalidRequest(
            f"'n' times the number of prompts must be between 1 and {MAX_CHOICES}", param="n"
        )
    options = field(body, "stream_options", dict, {})
    return _Job(
        chat=chat,
        model=model,
        prompts=[p for p in prompts for _ in range(n)],
        params=params,
        stream=field(body, "stream", bool, False),
        include_usage=field(options, "include_usage", bool, False),
        n=n,
        tools=tools if tools is not None and tools.parses else None,
    )


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = field(body, "messages", list, None)
    if not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    out = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in _ROLES:
            raise InvalidRequest(
                f"messages[{i}] must be an object with a role in {sorted(_ROLES)}", param="messages"
            )
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is understood here
            texts = [
                p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"
            ]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise InvalidRequest(
                    f"messages[{i}].content parts must all be text parts", param="messages"
                )
            content = "".join(texts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            raise InvalidRequest(
                f"messages[{i}].content must be a string or text parts", param="messages"
            )
        out.append({"role": role, "content": content})
    return out


async def _respond(
    call: Call, job: _Job, chunks: AsyncGenerator[tuple[int, TokenChunk], None]
) -> web.Response:
    choices = [_Choice() for _ in job.prompts]
    try:
        async with aclosing(chunks):
            async for index, chunk in chunks:
                _absorb(choices[index], chunk)
    except RequestCancelled as exc:
        raise CancelledWhileRunning(exc.reason) from exc
    body = _envelope(call, job)
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
    job: _Job,
    chunks: AsyncGenerator[tuple[int, TokenChunk], None],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        REQUEST_ID_HEADER: call.call_id,
    })  # fmt: skip
    await response.prepare(request)
    choices = [_Choice() for _ in job.prompts]
    if job.chat:
        for i in range(len(choices)):
            role = {"role": "assistant", "content": ""}
            piece = {"index": i, "delta": role, "logprobs": None, "finish_reason": None}
            await response.write(_event(call, job, [piece]))
    events = StreamEvents(_envelope(call, job), chat=job.chat)
    tools = [job.tools.choice() for _ in choices] if job.tools is not None else None
    try:
        async with aclosing(chunks):
            async for index, chunk in chunks:
                _absorb(choices[index], chunk, keep_text=False)  # the client has the text
                if tools is not None:
                    await _write_tool_delta(response, call, job, index, chunk, tools[index])
                elif chunk.text or chunk.finish_reason:
                    await response.write(events.chunk(index, chunk.text, chunk.finish_reason))
    except (RequestCancelled, GatewayError) as exc:
        await response.write(sse.encode(json.dumps({"error": _error_body(exc)})))
        await response.write_eof()
        return response
    if job.include_usage:
        usage = _envelope(call, job) | {"choices": [], "usage": _usage(job, choices)}
        await response.write(sse.encode(json.dumps(usage)))
    await response.write(sse.encode("[DONE]"))
    await response.write_eof()
    return response


async def _write_tool_delta(
    response: web.StreamResponse, call: Call, job: _Job, index: int, chunk: TokenChunk,
    tools: ChoiceTools,
) -> None:  # fmt: skip
    """One chunk of a choice whose answer goes through the tool parser (not the fast path:
    the parser decides what the delta holds, ``content`` or ``tool_calls``)."""
    finish = chunk.finish_reason.value if chunk.finish_reason else None
    if not chunk.text and finish is None:
        return
    delta = tools.delta(chunk.text, finish)
    if delta is None:
        return
    reason = tools.stream_finish(finish) if finish else None
    piece = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
    await response.write(_event(call, job, [piece]))


class StreamEvents:
    """The chunk events of one streamed answer: ``chunk(...)`` gives the bytes of
    ``sse.encode(json.dumps(envelope | {"choices": [choice]}))``, the choice being
    ``{"index", "delta": {"content": text}}`` (chat) or ``{"index", "text"}``, then
    ``"logprobs": null`` and the finish reason. The envelope is encoded once, here."""

    def __init__(self, envelope: dict[str, Any], *, chat: bool) -> None:
        opened = json.dumps(envelope)[:-1]  # without its closing brace: the choices follow
        key = "delta" if chat else "text"
        self._head = f'data: {opened}, "choices": [{{"index": '
        self._key = f', "{key}": {{"content": ' if chat else f', "{key}": '
        self._close = "}" if chat else ""
        self._tails = {
            reason: f', "logprobs": null, "finish_reason": {json.dumps(reason and reason.value)}'
            "}]}\n\n"
            for reason in (None, *FinishReason)
        }

    def chunk(self, index: int, text: str, finish: FinishReason | None) -> bytes:
        return (
            f"{self._head}{index}{self._key}{encode_basestring_ascii(text)}{self._close}"
            f"{self._tails[finish]}"
        ).encode()


def _absorb(choice: _Choice, chunk: TokenChunk, *, keep_text: bool = True) -> None:
    if keep_text:
        choice.text += chunk.text
    choice.tokens += chunk.new_tokens
    choice.prompt_tokens = chunk.prompt_tokens
    if chunk.finish_reason is not None:
        choice.finish_reason = chunk.finish_reason.value


def _envelope(call: Call, job: _Job) -> dict[str, Any]:
    prefix = "chatcmpl" if job.chat else "cmpl"
    return {"id": f"{prefix}-{call.call_id}", "object": job.object_name, "created": job.created,
            "model": job.model}  # fmt: skip


def _event(call: Call, job: _Job, choices: list[dict[str, Any]]) -> bytes:
    return sse.encode(json.dumps(_envelope(call, job) | {"choices": choices}))


def _final_choice(job: _Job, index: int, choice: _Choice) -> dict[str, Any]:
    if job.chat:
        message = {"role": "assistant", "content": choice.text}
        return {
            "index": index,
            "message": message,
            "logprobs": None,
            "finish_reason": choice.finish_reason,
        }
    return {
        "index": index,
        "text": choice.text,
        "logprobs": None,
        "finish_reason": choice.finish_reason,
    }


def _usage(job: _Job, choices: list[_Choice]) -> dict[str, int]:
    prompt = sum(
        c.prompt_tokens for c in choices[:: job.n]
    )  # each prompt counted once, not n times
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
