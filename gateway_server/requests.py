"""Request rules shared by every API, whatever the transport: typed fields, sampling parameters,
Triton's parameter names, and how a cancelled request is worded.

No I/O and no transport: dictionaries in, values out; every refusal is an ``InvalidRequest``
naming the field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gateway_server.engine.base import SamplingParams
from gateway_server.errors import InvalidRequest
from hangup_contract.vocabulary import Reason

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
    stops = stop_strings(body)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=field(body, "seed", int, None),
        stop=tuple(stops),
        ignore_eos=field(body, "ignore_eos", bool, False),
    )
