"""Request rules shared by every API, whatever the transport: typed fields, sampling parameters,
Triton's parameter names, and how a cancelled request is worded.

No I/O and no transport: dictionaries in, values out; every refusal is an ``InvalidRequest``
naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from gateway_server.engine.base import Engine, SamplingParams
from gateway_server.errors import InvalidRequest
from hangup_contract.cancel_labels import Reason

MAX_CHOICES = 16
"""Most engine requests one call may start (``n`` times the prompts)."""
FINAL_FLAG = "triton_final_response"
"""Response parameter: true on the last response of a request (Triton's decoupled protocol)."""
EMPTY_FINAL_OPT_IN = "triton_enable_empty_final_response"
"""Request parameter: end with an empty response carrying the final flag (Triton's opt-in)."""

T = TypeVar("T")


def cancelled_message(reason: Reason) -> str:
    """What a client is told when its request was cancelled under it."""
    return f"request cancelled ({reason})"


def json_value(raw: bytes | str, what: str, param: str | None = None) -> Any:
    """``raw`` read as JSON: the one reader of every JSON a client sends the gateway (a body,
    a JSON text inside one, a gRPC tensor's). Raises InvalidRequest naming ``what`` for anything
    else: not JSON, not UTF-8, nested deeper than Python's JSON reader goes (about 1,000 levels:
    a ``RecursionError`` there), or a number of more than 4,300 digits (Python's limit on reading
    an integer). The reader's work is linear in ``raw``."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}", param=param) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid UTF-8: {exc.reason}", param=param) from exc
    except RecursionError as exc:
        raise InvalidRequest(f"{what} is nested too deeply", param=param) from exc
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise InvalidRequest(f"{what} holds a number with too many digits", param=param) from exc


def json_object(raw: bytes | str, what: str, param: str | None = None) -> dict[str, Any]:
    """``raw`` read by :func:`json_value`, which must be a JSON object. Raises InvalidRequest
    naming ``what`` otherwise."""
    value = json_value(raw, what, param)
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object", param=param)
    return value


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
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "an array",
        dict: "an object",
    }.get(kind, kind.__name__)


def stop_strings(body: dict[str, Any]) -> list[str]:
    """``stop``: a string or an array of at most 4 strings, as a list."""
    stop = field(body, "stop", (str, list), [])
    stops = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stops) or len(stops) > 4:
        raise InvalidRequest(
            "'stop' must be a string or an array of at most 4 strings", param="stop"
        )
    return stops


TOKEN_BUDGET_CHAT = ("max_completion_tokens", "max_tokens")
"""The fields that bound a chat answer's length, the first given winning (vLLM's rule)."""
_INT64 = (-(2**63), 2**63 - 1)


def sampling_params(
    body: dict[str, Any],
    engine: Engine,
    *,
    max_model_len: int,
    default_max_tokens: int,
    budget: tuple[str, ...] = ("max_tokens",),
    logprobs: int | None = None,
) -> SamplingParams:
    """The sampling fields of ``body``, with vLLM's names, types and ranges: the one reader
    of every protocol (OpenAI's, the Responses API's as chat, KServe's over HTTP and gRPC).

    ``budget``: the fields that bound the answer's length, the first given winning. Whether
    the engine honours a field is the caller's check (:func:`check_sampling_fields`).
    """
    name = next((n for n in budget if body.get(n) is not None), budget[-1])
    max_tokens = field(body, name, int, default_max_tokens)
    if not 1 <= max_tokens <= max_model_len:
        raise InvalidRequest(f"'{name}' must be between 1 and {max_model_len}", param=name)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise InvalidRequest("'top_p' must be greater than 0 and at most 1", param="top_p")
    stops = stop_strings(body)
    seed = field(body, "seed", int, None)
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise InvalidRequest("'seed' must be a 64-bit integer", param="seed")
    top_k = field(body, "top_k", int, 0)
    if top_k < -1:
        raise InvalidRequest("'top_k' must be -1 or 0 (every token), or at least 1", param="top_k")
    min_tokens = field(body, "min_tokens", int, 0)
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidRequest(
            f"'min_tokens' must be between 0 and {name} ({max_tokens})", param="min_tokens"
        )
    repetition = _number(body, "repetition_penalty", 1.0, 0.0, 2.0**31)
    if repetition == 0.0:
        raise InvalidRequest(
            "'repetition_penalty' must be greater than 0", param="repetition_penalty"
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=tuple(stops),
        ignore_eos=field(body, "ignore_eos", bool, False),
        top_k=top_k if top_k > 0 else 0,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=repetition,
        stop_token_ids=_token_ids(body, "stop_token_ids", engine.vocab_size),
        min_tokens=min_tokens,
        logit_bias=_logit_bias(body, engine.vocab_size),
        include_stop_str_in_output=field(body, "include_stop_str_in_output", bool, False),
        skip_special_tokens=field(body, "skip_special_tokens", bool, True),
        logprobs=logprobs,
    )


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = field(body, name, (int, float), default)
    if not low <= value <= high:  # compared as given: an integer too large for a float is out
        raise InvalidRequest(f"'{name}' must be between {low:g} and {high:g}", param=name)
    return float(value)


def _token_ids(body: dict[str, Any], name: str, vocab: int) -> tuple[int, ...]:
    ids = field(body, name, list, [])
    if not all(type(i) is int and 0 <= i < vocab for i in ids):
        raise InvalidRequest(f"'{name}' must be token ids between 0 and {vocab - 1}", param=name)
    return tuple(ids)


_TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,20}")
"""A ``logit_bias`` key: a token id in ASCII digits (vLLM reads any spelling ``int()`` takes:
other digits, signs, spaces, underscores; they are refused here, so one token has few keys)."""


def _logit_bias(body: dict[str, Any], vocab: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias``: token ids to numbers, each clamped to [-100, 100] as vLLM clamps it. A
    key that is no token id, a value that is no number, and ids outside the vocabulary (the
    first few named, in vLLM's words) are refused."""
    given = field(body, "logit_bias", dict, {})
    out = []
    for key, value in given.items():
        if not _TOKEN_ID_KEY.fullmatch(key) or type(value) not in (int, float):
            raise InvalidRequest("'logit_bias' must map token ids to numbers", param="logit_bias")
        out.append((int(key), float(min(100.0, max(-100.0, value)))))  # clamped before float()
    outside = [token for token, _ in out if not 0 <= token < vocab]
    if outside:
        raise InvalidRequest(
            f"token_id(s) {outside[:8]} in 'logit_bias' contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab}",
            param="logit_bias",
        )
    return tuple(out)
