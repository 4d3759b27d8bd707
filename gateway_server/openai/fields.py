"""The rule for the OpenAI API's request fields: one table per endpoint, the one place that says
what the gateway does with each field it knows.

Every field of a request body is **honoured** (answered as ``vllm serve`` answers it), accepted
as **metadata** (OpenAI clients send it; it changes nothing a model server does), or
**refused** with 400 naming the field and why. A field that is in neither table is refused as
unknown. A honoured field may need an engine :class:`~gateway_server.engine.base.Feature`: an
engine without it refuses the field by name ("'logprobs' is not supported by the simulated
engine") instead of answering without it.

A value that asks for nothing (JSON ``null``, and each rule's ``off`` values: ``"echo": false``,
``"tool_choice": "none"``, ``"response_format": {"type": "text"}``) is accepted whatever the
rule, as ``vllm serve`` accepts it: a client that spells out a default is not refused.

Names, types and ranges follow vLLM's ``ChatCompletionRequest`` and ``CompletionRequest``
(0.32); :func:`check` only decides honoured or refused, the endpoint's parser reads the values.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway_server.engine.base import Feature
from gateway_server.errors import InvalidRequest


class Use(enum.Enum):
    HONOURED = "honoured"
    METADATA = "metadata"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    use: Use
    why: str = ""
    """Refused: what the client is told after the field's name."""
    needs: Feature | None = None
    """Honoured only by an engine with this feature; refused by name elsewhere."""
    off: tuple[Any, ...] = ()
    """Values that ask for nothing: accepted whatever the rule and the engine."""


def honoured(needs: Feature | None = None, *off: Any) -> Rule:
    return Rule(Use.HONOURED, needs=needs, off=off)


def refused(why: str, *off: Any) -> Rule:
    return Rule(Use.REFUSED, why, off=off)


METADATA = Rule(Use.METADATA)
NOT_YET = "is not supported by hangup's gateway yet"
GUIDED = "is not read by vllm serve 0.32 (it answers unconstrained): use 'structured_outputs'"
FUNCTIONS = "(OpenAI's deprecated function calling) is not supported: use 'tools'"
_NO_TEXT_FORMAT = ({"type": "text"},)

_SHARED: dict[str, Rule] = {
    # Honoured by every engine.
    "model": honoured(),
    "max_tokens": honoured(),
    "n": honoured(),
    "seed": honoured(),
    "stop": honoured(),
    "stream": honoured(),
    "stream_options": honoured(),
    "temperature": honoured(),
    "top_p": honoured(),
    "ignore_eos": honoured(),
    "include_stop_str_in_output": honoured(None, False),
    "skip_special_tokens": honoured(None, True),
    # Honoured where the engine can do it honestly.
    "top_k": honoured(Feature.TOP_K, 0, -1),
    "min_p": honoured(Feature.MIN_P, 0, 0.0),
    "presence_penalty": honoured(Feature.PENALTIES, 0, 0.0),
    "frequency_penalty": honoured(Feature.PENALTIES, 0, 0.0),
    "repetition_penalty": honoured(Feature.PENALTIES, 1, 1.0),
    "logit_bias": honoured(Feature.LOGIT_BIAS, {}),
    "stop_token_ids": honoured(Feature.STOP_TOKEN_IDS, []),
    "min_tokens": honoured(Feature.MIN_TOKENS, 0),
    "response_format": honoured(Feature.STRUCTURED, *_NO_TEXT_FORMAT),
    "structured_outputs": honoured(Feature.STRUCTURED),
    # What OpenAI clients send as metadata: accepted, changes nothing.
    "user": METADATA,
    "metadata": METADATA,
    "store": METADATA,
    "service_tier": METADATA,
    # Not (yet) done by the gateway: refused by name.
    "guided_json": refused(GUIDED),
    "guided_regex": refused(GUIDED),
    "guided_choice": refused(GUIDED),
    "guided_grammar": refused(GUIDED),
    "guided_decoding_backend": refused(GUIDED),
    "guided_whitespace_pattern": refused(GUIDED),
    "use_beam_search": refused("(beam search) " + NOT_YET, False),
    "length_penalty": refused("(beam search) " + NOT_YET, 1, 1.0),
    "prompt_logprobs": refused(NOT_YET),
    "logprob_token_ids": refused(NOT_YET, []),
    "allowed_token_ids": refused(NOT_YET, []),
    "bad_words": refused(NOT_YET, []),
    "spaces_between_special_tokens": refused(NOT_YET, True),
    "truncate_prompt_tokens": refused(NOT_YET),
    "truncation_side": refused(NOT_YET),
    "add_special_tokens": refused(NOT_YET),
    "priority": refused("(priority scheduling) " + NOT_YET, 0),
    "request_id": refused("is not read from the body: send the X-Request-Id header"),
    "session_id": refused(NOT_YET),
    "cache_salt": refused("(prefix-cache salt) " + NOT_YET),
    "kv_transfer_params": refused(NOT_YET),
    "ec_transfer_params": refused(NOT_YET),
    "vllm_xargs": refused(NOT_YET),
    "repetition_detection": refused(NOT_YET),
    "stream_interval": refused(NOT_YET),
    "thinking_token_budget": refused("(reasoning) " + NOT_YET),
    "watermarking": refused(NOT_YET, False),
    "return_tokens_as_token_ids": refused(NOT_YET, False),
    "return_token_ids": refused(NOT_YET, False),
    "return_token_offsets": refused(NOT_YET, False),
    "routed_experts_prompt_start": refused(NOT_YET, 0),
    "mm_payload": refused("(multimodal input) " + NOT_YET),
    "return_mm_kwargs": refused("(multimodal input) " + NOT_YET),
}

SAMPLING_FIELDS = (
    "max_tokens", "max_completion_tokens", "seed", "stop", "temperature", "top_p", "ignore_eos",
    "include_stop_str_in_output", "skip_special_tokens", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "stop_token_ids", "min_tokens",
)  # fmt: skip
"""The fields :func:`gateway_server.requests.sampling_params` reads: what KServe's
``sampling_parameters`` may hold."""


def check_sampling(
    options: Mapping[str, Any], features: Iterable[Feature], engine: str, *, strict: bool
) -> None:
    """Refuse a sampling field of ``options`` that the engine does not honour, as
    :func:`check` does; ``strict``: refuse any other field too (a ``sampling_parameters``
    object holds sampling fields only)."""
    table = {name: _SHARED.get(name, honoured()) for name in SAMPLING_FIELDS}
    if strict:
        for name in options:
            if name not in table:
                raise InvalidRequest(
                    f"'{name}' is not a sampling parameter this gateway knows", param=name
                )
    check({k: v for k, v in options.items() if k in table}, table, features, engine)


CHAT: Mapping[str, Rule] = _SHARED | {
    "messages": honoured(),
    "max_completion_tokens": honoured(),
    "logprobs": honoured(Feature.LOGPROBS, False),
    "top_logprobs": honoured(Feature.LOGPROBS, 0),
    "add_generation_prompt": honoured(),
    "continue_final_message": honoured(None, False),
    "chat_template_kwargs": honoured(None, {}),
    "tools": honoured(Feature.TOOLS),
    "tool_choice": honoured(Feature.TOOLS, "none"),
    "parallel_tool_calls": honoured(),  # read with tools; without them it asks for nothing
    "functions": refused(FUNCTIONS),
    "function_call": refused(FUNCTIONS, "none"),
    "echo": refused("(echo of the last message in chat) " + NOT_YET, False),
    "reasoning_effort": refused("(reasoning) " + NOT_YET),
    "include_reasoning": refused("(reasoning) " + NOT_YET, True),
    "documents": refused(NOT_YET),
    "chat_template": refused("(a chat template per request) " + NOT_YET),
    "media_io_kwargs": refused("(multimodal input) " + NOT_YET),
    "mm_processor_kwargs": refused("(multimodal input) " + NOT_YET),
    "return_prompt_text": refused(NOT_YET, False),
    "modalities": refused("(audio output) " + NOT_YET, ["text"]),
    "audio": refused("(audio output) " + NOT_YET),
    "prediction": refused("(predicted outputs) " + NOT_YET),
    "web_search_options": refused("(web search) " + NOT_YET),
}
"""``POST /v1/chat/completions``."""

COMPLETIONS: Mapping[str, Rule] = _SHARED | {
    "prompt": honoured(),
    "logprobs": honoured(Feature.LOGPROBS),
    "echo": honoured(Feature.ECHO, False),
    "suffix": refused("is not supported: the model has no fill-in-the-middle template", ""),
    "best_of": refused(NOT_YET, 1),
    "prompt_embeds": refused("(prompt embeddings) " + NOT_YET),
}
"""``POST /v1/completions``."""


def check(
    body: Mapping[str, Any], table: Mapping[str, Rule], features: Iterable[Feature], engine: str
) -> None:
    """Refuse the first field of ``body`` that the gateway does not honour: InvalidRequest naming
    it and why. ``features``: what the serving engine does; ``engine``: its name for the message
    ("the simulated engine")."""
    have = frozenset(features)
    for name, value in body.items():
        rule = table.get(name)
        if rule is None:
            raise InvalidRequest(f"'{name}' is not a field this endpoint knows", param=name)
        if value is None or rule.use is Use.METADATA or _asks_nothing(rule, value):
            continue
        if rule.use is Use.REFUSED:
            raise InvalidRequest(f"'{name}' {rule.why}", param=name)
        if rule.needs is not None and rule.needs not in have:
            raise InvalidRequest(f"'{name}' is not supported by {engine}", param=name)


def _asks_nothing(rule: Rule, value: Any) -> bool:
    # bool is an int in Python: True must not match an ``off`` value of 1 (nor False one of 0).
    return any(type(value) is type(off) and value == off for off in rule.off) or (
        isinstance(value, int | float) and not isinstance(value, bool)
        and any(type(off) in (int, float) and value == off for off in rule.off)
    )  # fmt: skip
