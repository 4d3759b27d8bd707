"""Request plumbing shared by the HTTP APIs: request ids, JSON bodies, typed fields."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web

from gateway_server.engine.base import SamplingParams
from gateway_server.errors import InvalidRequest, RequestTooLarge
from gateway_server.service import GenerationService
from gateway_server.vocabulary import Protocol
from hangup_contract import request_id as request_ids

REQUEST_ID_HEADER = request_ids.HEADER

SERVICE = web.AppKey("service", GenerationService)
CANCEL_TOKEN = web.AppKey("cancel_token", str)
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
# What the error middleware needs to count a refused generation request.
PROTOCOL = web.RequestKey("protocol", Protocol)
MODEL = web.RequestKey("model", str)
MAX_CHOICES = 16

T = TypeVar("T")


def request_id(request: web.Request) -> str:
    """The caller's ``X-Request-Id``, or a fresh 128-bit random id. Raises InvalidRequest for
    one that breaks the contract's rule."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return request_ids.new_request_id()
    if not request_ids.is_valid(given):
        raise InvalidRequest(f"{REQUEST_ID_HEADER} must be {request_ids.RULE}")
    return given


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object. Raises RequestTooLarge or InvalidRequest naming the problem."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestTooLarge(
            f"request body is larger than the limit of {request.app[MAX_BODY_BYTES]} bytes"
        ) from exc
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def field(body: dict[str, Any], name: str, kind: type[T] | tuple[type, ...], default: Any) -> Any:
    """``body[name]`` checked against ``kind`` (bool is never accepted as a number)."""
    if name not in body or body[name] is None:
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    numeric = any(k in (int, float) for k in kinds)
    if (numeric and isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(_type_name(k) for k in kinds)
        raise InvalidRequest(f"'{name}' must be {names}", param=name)
    return value


def _type_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
            list: "an array", dict: "an object"}.get(kind, kind.__name__)  # fmt: skip


def sampling_params(
    body: dict[str, Any], *, max_model_len: int, default_max_tokens: int
) -> SamplingParams:
    """Sampling fields shared by the OpenAI and Triton APIs, validated."""
    max_tokens = field(body, "max_tokens", int, None)
    if max_tokens is None:
        max_tokens = field(body, "max_completion_tokens", int, default_max_tokens)
    if not 1 <= max_tokens <= max_model_len:
        raise InvalidRequest(
            f"'max_tokens' must be between 1 and {max_model_len}", param="max_tokens"
        )
    temperature = float(field(body, "temperature", (int, float), 1.0))
    if not 0.0 <= temperature <= 2.0:
        raise InvalidRequest("'temperature' must be between 0 and 2", param="temperature")
    top_p = float(field(body, "top_p", (int, float), 1.0))
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest("'top_p' must be greater than 0 and at most 1", param="top_p")
    stop = field(body, "stop", (str, list), [])
    stops = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stops) or len(stops) > 4:
        raise InvalidRequest(
            "'stop' must be a string or an array of at most 4 strings", param="stop"
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=field(body, "seed", int, None),
        stop=tuple(stops),
        ignore_eos=field(body, "ignore_eos", bool, False),
    )


def check_prompt_fits(prompt_tokens: int, params: SamplingParams, max_model_len: int) -> None:
    if prompt_tokens + params.max_tokens > max_model_len:
        raise InvalidRequest(
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
            f"model's context length of {max_model_len} tokens",
            param="prompt",
        )
