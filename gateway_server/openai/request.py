"""An OpenAI request body read into what the gateway runs: the prompts, one set of sampling
parameters per choice, and what the answer must carry (log-probabilities, echo, usage).

Order: :func:`gateway_server.openai.fields.check` first (every field honoured or refused by
name), then each honoured field is read here with vLLM's names, types and ranges; every refusal
is an ``InvalidRequest`` naming the field. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gateway_server.engine.base import ChatOptions, Engine, Feature, SamplingParams
from gateway_server.engine.constraint import StructuredOutput
from gateway_server.engine.tools import ToolPlan
from gateway_server.errors import InvalidRequest
from gateway_server.openai.fields import CHAT, COMPLETIONS, check
from gateway_server.openai.structured import parse_structured
from gateway_server.requests import (
    MAX_CHOICES,
    TOKEN_BUDGET_CHAT,
    field,
    json_value,
    sampling_params,
)
from gateway_server.service import GenerationService

MAX_LOGPROBS = 20
"""Most top candidates per token (vLLM's default ``--max-logprobs``)."""
_ROLES = {"system", "user", "assistant", "tool", "developer"}
_MESSAGE_KEYS = {"role", "content", "name", "tool_call_id", "tool_calls"}


@dataclass(frozen=True)
class Choice:
    """One engine request: choice ``index`` of the answer."""

    prompt: str | tuple[int, ...]
    params: SamplingParams
    echo: str | None = None
    """The prompt's text, to put before the answer (completions' ``echo``)."""


@dataclass(frozen=True)
class OpenAIJob:
    chat: bool
    model: str
    choices: list[Choice]
    stream: bool
    include_usage: bool
    n: int
    top_logprobs: int | None
    """Log-probabilities in the answer (candidates per token), None when not asked for."""
    tools: ToolPlan | None = None
    """Set when answers go through the tool-call parser (:mod:`gateway_server.engine.tools`)."""


def parse(body: dict[str, Any], service: GenerationService, *, chat: bool) -> OpenAIJob:
    """Read a request; raises InvalidRequest naming the field (see module doc), ModelNotFound."""
    engine, max_model_len = service.engine, service.model.max_model_len
    structured = parse_structured(body)  # what vllm serve refuses whatever the engine, first
    check(body, CHAT if chat else COMPLETIONS, engine.features, engine.name)
    model = field(body, "model", str, None)
    if model is None:
        raise InvalidRequest("'model' is required", param="model")
    service.check_model(model)
    stream = field(body, "stream", bool, False)
    options = field(body, "stream_options", dict, {})
    if options and not stream:
        raise InvalidRequest(
            "'stream_options' can only be defined when 'stream' is true", param="stream_options"
        )
    for key in options:
        if key != "include_usage" and not (key == "continuous_usage_stats" and not options[key]):
            raise InvalidRequest(f"'stream_options.{key}' is not supported", param="stream_options")
    n = field(body, "n", int, 1)
    top = _chat_logprobs(body) if chat else _completion_logprobs(body)
    budget = TOKEN_BUDGET_CHAT if chat else ("max_tokens",)
    params = sampling_params(
        body, engine, max_model_len=max_model_len, default_max_tokens=256 if chat else 16,
        budget=budget, logprobs=top,
    )  # fmt: skip
    tools = service.plan_tools(body) if chat else None
    params = _constrained(service, params, structured, tools)
    if chat:
        prompts: list[str | tuple[int, ...]] = [_chat_prompt(body, service, tools)]
        echo = False
    else:
        prompts = _prompts(body, engine)
        echo = field(body, "echo", bool, False)
    if echo and top is not None:
        if Feature.PROMPT_LOGPROBS not in engine.features:
            raise InvalidRequest(
                f"'echo' with 'logprobs' is not supported by {engine.name}", param="echo"
            )
        params = replace(params, prompt_logprobs=top)
    if not 1 <= n <= MAX_CHOICES or n * len(prompts) > MAX_CHOICES:
        raise InvalidRequest(
            f"'n' times the number of prompts must be between 1 and {MAX_CHOICES}", param="n"
        )
    choices = []
    for prompt in prompts:
        service.check_prompt(prompt, params)
        shown = engine.prompt_text(prompt) if echo else None
        for i in range(n):  # as vLLM's parallel sampling: choice i of a prompt draws with seed+i
            seeded = params if params.seed is None else replace(params, seed=params.seed + i)
            choices.append(Choice(prompt, seeded, shown))
    usage = field(options, "include_usage", bool, False)
    parsed = tools if tools is not None and tools.parses else None
    return OpenAIJob(chat, model, choices, stream, usage, n, top, parsed)


def _constrained(
    service: GenerationService,
    params: SamplingParams,
    structured: StructuredOutput | None,
    tools: ToolPlan | None,
) -> SamplingParams:
    """``params`` with the request's structured output, or the one a named or ``"required"``
    ``tool_choice`` puts in its place (as vLLM's parsers do), checked by the engine; a tool
    parser that reads special tokens keeps them in the text."""
    if tools is not None and tools.parses and not tools.skip_special_tokens:
        params = replace(params, skip_special_tokens=False)
    if tools is not None and tools.structured is not None:
        structured = tools.structured
    if structured is None:
        return params
    params = replace(params, structured=structured)
    service.check_params(params)
    return params


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = field(body, "logprobs", bool, False)
    top = field(body, "top_logprobs", int, 0)
    if not 0 <= top <= MAX_LOGPROBS:
        raise InvalidRequest(
            f"'top_logprobs' must be between 0 and {MAX_LOGPROBS}", param="top_logprobs"
        )
    if top and not wanted:
        raise InvalidRequest(
            "when using 'top_logprobs', 'logprobs' must be set to true", param="top_logprobs"
        )
    return top if wanted else None


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    top: int | None = field(body, "logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise InvalidRequest(f"'logprobs' must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    return top


def _prompts(body: dict[str, Any], engine: Engine) -> list[str | tuple[int, ...]]:
    raw = body.get("prompt")
    bad = InvalidRequest(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of "
        "arrays of token ids, not empty",
        param="prompt",
    )
    if isinstance(raw, str) and raw:
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise bad
    if all(isinstance(p, str) for p in raw):
        return list(raw)
    lists = raw if all(isinstance(p, list) for p in raw) else [raw]
    if not all(p and all(type(i) is int for i in p) for p in lists):
        raise bad
    if Feature.TOKEN_PROMPTS not in engine.features:
        raise InvalidRequest(
            f"'prompt' as token ids is not supported by {engine.name}", param="prompt"
        )
    vocab = engine.vocab_size
    if not all(0 <= i < vocab for p in lists for i in p):
        raise InvalidRequest(
            f"'prompt' token ids must be between 0 and {vocab - 1}", param="prompt"
        )
    return [tuple(p) for p in lists]


def _chat_prompt(body: dict[str, Any], service: GenerationService, tools: ToolPlan | None) -> str:
    add = field(body, "add_generation_prompt", bool, True)
    cont = field(body, "continue_final_message", bool, False)
    if add and cont:
        raise InvalidRequest(
            "cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
            param="continue_final_message",
        )
    kwargs = field(body, "chat_template_kwargs", dict, {})
    given = tools.tool_dicts if tools is not None else None
    options = ChatOptions(add, cont, tuple(kwargs.items()), tuple(given) if given else None)
    return service.chat_prompt(messages(body), options)


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat's messages as a chat template reads them (text parts joined by newlines, as
    vLLM joins them; ``name``, ``tool_call_id`` and ``tool_calls`` kept)."""
    given = field(body, "messages", list, None)
    if not given:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    return [_message(i, m) for i, m in enumerate(given)]


def _message(i: int, message: Any) -> dict[str, Any]:
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequest(
            f"messages[{i}] must be an object with a role in {sorted(_ROLES)}", param="messages"
        )
    unknown = sorted(set(message) - _MESSAGE_KEYS)
    if unknown:
        raise InvalidRequest(
            f"messages[{i}].{unknown[0]} is not a field this endpoint knows", param="messages"
        )
    out: dict[str, Any] = {"role": role, "content": _content(i, message.get("content"), role)}
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = _text(i, key, message[key])
    if message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(i, message["tool_calls"])
    return out


def _text(i: int, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"messages[{i}].{key} must be a string", param="messages")
    return value


def _content(i: int, content: Any, role: str) -> str:
    if content is None and role in ("assistant", "tool"):
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"messages[{i}].content must be a string or text parts", param="messages"
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_audio", "video_url", "audio_url", "file"):
            raise InvalidRequest(
                f"messages[{i}].content[{j}]: '{kind}' parts are not supported: the served "
                "model takes text only",
                param="messages",
            )
        else:
            raise InvalidRequest(
                f"messages[{i}].content[{j}] must be a text part", param="messages"
            )
    return "\n".join(texts)


def _tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant's earlier tool calls, as vLLM hands them to a template: each call's
    ``arguments`` JSON read into an object."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise InvalidRequest(
            f"messages[{i}].tool_calls must be an array of objects", param="messages"
        )
    out = []
    for call in calls:
        call = dict(call)
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            what = f"the arguments of messages[{i}].tool_calls"
            arguments = json_value(function["arguments"], what, param="messages")
            call["function"] = function | {"arguments": arguments}
        out.append(call)
    return out
