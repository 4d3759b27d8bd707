"""A ``POST /v1/responses`` body read into what the gateway runs.

Order: the field table (:data:`RESPONSES`, the rule of :mod:`gateway_server.openai.fields`)
first, then the Responses fields are read here (``input``, ``instructions``,
``previous_response_id``, ``max_output_tokens``, ``text.format``) and the request is handed to
the chat path's reader as the chat request it is: the messages (the instructions as a system
message, the earlier turns, the input), ``max_output_tokens`` as ``max_tokens``, ``text.format``
as ``response_format``, and the sampling fields both APIs share unchanged. So a response's
prompt and sampling are a chat completion's. Every refusal names the Responses field. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gateway_server.engine.base import Feature, SamplingParams
from gateway_server.errors import InvalidRequest
from gateway_server.openai.fields import CHAT, METADATA, NOT_YET, Rule, check, honoured, refused
from gateway_server.openai.request import parse
from gateway_server.requests import field
from gateway_server.service import GenerationService

_TEXT_OFF: tuple[dict[str, Any], ...] = ({"format": {"type": "text"}}, {})
_SHARED_HONOURED = (
    "seed",
    "stop",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stop_token_ids",
    "structured_outputs",
)
"""vLLM's extra sampling fields, the same in both APIs: passed to the chat reader as given."""
_SHARED_REFUSED = (
    "request_id",
    "priority",
    "cache_salt",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "watermarking",
    "session_id",
    "mm_payload",
    "return_mm_kwargs",
)

RESPONSES: Mapping[str, Rule] = {
    "model": honoured(),
    "input": honoured(),
    "instructions": honoured(),
    "max_output_tokens": honoured(),
    "temperature": honoured(),
    "top_p": honoured(),
    "stream": honoured(),
    "background": honoured(),
    "store": honoured(),
    "previous_response_id": honoured(),
    "text": honoured(Feature.STRUCTURED, *_TEXT_OFF),
    "chat_template_kwargs": honoured(None, {}),
    **{name: CHAT[name] for name in _SHARED_HONOURED + _SHARED_REFUSED},
    "metadata": honoured(),  # stored and echoed
    "user": METADATA,
    "service_tier": METADATA,
    "safety_identifier": METADATA,
    "prompt_cache_key": METADATA,
    "parallel_tool_calls": METADATA,  # it asks for nothing without tools
    "truncation": refused("'auto' (dropping input to fit) " + NOT_YET, "disabled"),
    "include": refused(NOT_YET, []),
    "tools": refused("(tools in the Responses API) " + NOT_YET, []),
    "tool_choice": refused("(tools in the Responses API) " + NOT_YET, "auto", "none"),
    "max_tool_calls": refused("(tools in the Responses API) " + NOT_YET),
    "reasoning": refused("(reasoning) " + NOT_YET),
    "include_reasoning": refused("(reasoning) " + NOT_YET, True),
    "top_logprobs": refused("(log-probabilities in the Responses API) " + NOT_YET, 0),
    "prompt": refused("(stored prompt templates) is not supported: send 'input'"),
    "conversation": refused("(stored conversations) is not supported: use 'previous_response_id'"),
    "context_management": refused(NOT_YET),
    "background_options": refused(NOT_YET),
    "prompt_cache_options": refused(NOT_YET),
    "moderation": refused("(moderation) is not supported"),
    "image": refused("(image generation) is not supported"),
    "access_programs": refused("is not supported"),
    "stream_options": refused(NOT_YET),
    "prompt_cache_retention": refused(NOT_YET),
    "enable_response_messages": refused(NOT_YET, False),
    "previous_input_messages": refused("(harmony messages) is not supported"),
    "media_io_kwargs": refused("(multimodal input) " + NOT_YET),
    "mm_processor_kwargs": refused("(multimodal input) " + NOT_YET),
}
"""``POST /v1/responses``: honoured, metadata or refused (``openai_fields``' rule)."""

_ROLES = ("user", "system", "developer", "assistant")
_PART_TYPES = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponsesJob:
    model: str
    prompt: str | tuple[int, ...]
    params: SamplingParams
    stream: bool
    background: bool
    store: bool
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, Any] | None
    previous_response_id: str | None
    text_format: dict[str, Any]
    turns: list[dict[str, Any]]
    """Every message of the conversation so far but the instructions (the earlier turns and
    this input): what a later ``previous_response_id`` continues, with this answer added."""
    temperature: float
    top_p: float


def read(
    body: dict[str, Any], service: GenerationService, earlier: list[dict[str, Any]] | None
) -> ResponsesJob:
    """Read a request; ``earlier``: the turns of its ``previous_response_id`` (the caller looks it
    up). Raises InvalidRequest naming the field, ModelNotFound."""
    engine = service.engine
    check(body, RESPONSES, engine.features, engine.name)
    background = field(body, "background", bool, False)
    store = field(body, "store", bool, True)
    if background and not store:
        raise InvalidRequest("'background' needs 'store': true", param="background")
    instructions = field(body, "instructions", str, None)
    turns = [*(earlier or []), *input_messages(body.get("input"))]
    fmt = text_format(body)
    limit = service.model.max_model_len
    wanted = field(body, "max_output_tokens", int, None)
    if wanted is not None and not 1 <= wanted <= limit:
        raise InvalidRequest(
            f"'max_output_tokens' must be between 1 and {limit}", param="max_output_tokens"
        )
    chat = _chat_body(body, instructions, turns, fmt, wanted)
    try:
        choice = parse(chat, service, chat=True).choices[0]
    except InvalidRequest as exc:
        raise _renamed(exc) from exc
    params = choice.params
    if wanted is None:  # as vllm serve: whatever the context leaves
        room = limit - engine.count_prompt_tokens(choice.prompt)
        if room < 1:
            raise InvalidRequest(f"the input fills the context of {limit} tokens", param="input")
        params = replace(params, max_tokens=room)
    return ResponsesJob(
        chat["model"],
        choice.prompt,
        params,
        stream=field(body, "stream", bool, False),
        background=background,
        store=store,
        instructions=instructions,
        max_output_tokens=wanted,
        metadata=_metadata(body),
        previous_response_id=field(body, "previous_response_id", str, None),
        text_format=fmt,
        turns=turns,
        temperature=params.temperature,
        top_p=params.top_p,
    )


def _metadata(body: dict[str, Any]) -> dict[str, str] | None:
    """``metadata`` within OpenAI's bounds (it is stored with the response): at most 16 pairs,
    keys up to 64 characters, string values up to 512. Raises InvalidRequest."""
    given: dict[str, Any] | None = field(body, "metadata", dict, None)
    if given is None:
        return None
    fits = all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in given.items())
    if len(given) > 16 or not fits:
        raise InvalidRequest(
            "'metadata' must hold at most 16 pairs, keys of up to 64 characters and string "
            "values of up to 512",
            param="metadata",
        )
    return given


def _chat_body(
    body: dict[str, Any],
    instructions: str | None,
    turns: list[dict[str, Any]],
    fmt: dict[str, Any],
    max_tokens: int | None,
) -> dict[str, Any]:
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat: dict[str, Any] = {"model": body.get("model"), "messages": [*system, *turns]}
    chat["max_tokens"] = max_tokens or 1  # without one: set from the prompt's length after
    for name in ("temperature", "top_p", "chat_template_kwargs", *_SHARED_HONOURED):
        if body.get(name) is not None:
            chat[name] = body[name]
    if fmt["type"] == "json_schema":
        schema = {"name": fmt["name"], "schema": fmt["schema"]}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt["type"] == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _renamed(exc: InvalidRequest) -> InvalidRequest:
    """The chat reader's refusal, naming the Responses field."""
    names = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}
    param = names.get(exc.param or "", exc.param)
    message = exc.message.replace("max_tokens", "max_output_tokens")
    if exc.param == "prompt":
        param = "input"
    return InvalidRequest(message, param=param)


def input_messages(raw: object) -> list[dict[str, Any]]:
    """``input`` as chat messages: a string is one user message; a list holds message items
    (``role`` and ``content``: a string or text parts). Raises InvalidRequest naming the item."""
    if isinstance(raw, str):
        if not raw:
            raise InvalidRequest("'input' must not be empty", param="input")
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of message items", param="input"
        )
    return [_message(i, item) for i, item in enumerate(raw)]


def _message(i: int, item: object) -> dict[str, Any]:
    kind = item.get("type", "message") if isinstance(item, dict) else None
    if kind != "message" or not isinstance(item, dict):
        raise InvalidRequest(
            f"input[{i}]: only message items are supported (got {kind!r})", param="input"
        )
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(f"input[{i}].role must be one of {list(_ROLES)}", param="input")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"input[{i}].content must be a string or an array of text parts", param="input"
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _PART_TYPES or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"input[{i}].content[{j}]: only text parts ({', '.join(_PART_TYPES[:2])}) are "
                f"supported: the served model takes text only (got {kind!r})",
                param="input",
            )
        texts.append(part["text"])
    return {"role": role, "content": "\n".join(texts)}


def text_format(body: dict[str, Any]) -> dict[str, Any]:
    """``text.format`` checked (``{"type": "text"}`` when not given). Raises InvalidRequest."""
    text = field(body, "text", dict, {})
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise InvalidRequest(
            f"'text.{unknown[0]}' is not a field this endpoint knows", param="text"
        )
    if text.get("verbosity") not in (None, "medium"):
        raise InvalidRequest("'text.verbosity' " + NOT_YET, param="text")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind != "text" and body.get("structured_outputs") is not None:
        raise InvalidRequest(  # vLLM's words
            "Cannot specify both structured_outputs and text.format", param="structured_outputs"
        )
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise InvalidRequest(
            "'text.format' must be an object with a type of 'text', 'json_object' or 'json_schema'",
            param="text",
        )
    assert isinstance(fmt, dict)
    if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest(
            "'text.format' of type 'json_schema' needs a 'name' string and a 'schema' object",
            param="text",
        )
    return {k: fmt[k] for k in ("type", "name", "schema", "strict", "description") if k in fmt}
