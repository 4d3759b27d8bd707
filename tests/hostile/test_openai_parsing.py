"""The OpenAI request parsing under hostile input: the JSON body (deep nesting of every kind,
numbers past what Python reads, bytes that are no UTF-8), ``logit_bias`` keys and values, the
sampling numbers, and the Responses list's ``starting_after``. Each input is read the way a
handler reads it (``json_object``, then the endpoint's reader over a real simulated engine's
service) and ends in a parsed request or a client error (a 4xx in OpenAI's shape), never another
exception (a 500 with a traceback), within the hostile tier's CPU budget
(``bench/harness/hostile.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import MIB, Budget, timed
from gateway_server.errors import ClientError
from gateway_server.http.responses import sequence_number
from gateway_server.openai.request import parse
from gateway_server.openai.responses.request import read
from gateway_server.requests import json_object
from tests.support.gateway import MODEL, unstarted_service

HOSTILE = settings(
    max_examples=200, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
BUDGET = Budget()


SERVICE = unstarted_service()


def _chat(body: dict[str, Any]) -> object:
    return parse(body, SERVICE, chat=True)


def _completion(body: dict[str, Any]) -> object:
    return parse(body, SERVICE, chat=False)


def _responses(body: dict[str, Any]) -> object:
    return read(body, SERVICE, None)


READERS: dict[str, tuple[Callable[[dict[str, Any]], object], dict[str, Any]]] = {
    "chat": (_chat, {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    "completions": (_completion, {"model": MODEL, "prompt": "x"}),
    "responses": (_responses, {"model": MODEL, "input": "x"}),
}


def handled(raw: bytes, reader: Callable[[dict[str, Any]], object]) -> BaseException | None:
    """Read ``raw`` as a handler does; the error it ends in (None: parsed). Anything but a client
    error fails the test, naming it; so does a read over the CPU budget."""
    outcome = timed(lambda: reader(json_object(raw, "request body")))
    BUDGET.check(f"a body of {len(raw):,} bytes", len(raw), outcome.spent)
    if outcome.error is not None and not isinstance(outcome.error, ClientError):
        raise AssertionError(f"{type(outcome.error).__name__}: {outcome.error}") from outcome.error
    return outcome.error


def nested(kind: str, depth: int) -> str:
    """A JSON value ``depth`` levels deep, written out (``json.dumps`` itself stops near 1,000)."""
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


FIELDS = [
    "metadata", "messages", "prompt", "input", "stop", "logit_bias", "tools",
    "response_format", "chat_template_kwargs", "user", "text", "frobnicate",
]  # fmt: skip


@HOSTILE
@given(
    st.sampled_from(sorted(READERS)),
    st.sampled_from(FIELDS),
    st.sampled_from(["array", "object"]),
    st.integers(1, 3000),
)
def test_a_field_nested_at_any_depth_is_read_or_refused(
    endpoint: str, name: str, kind: str, depth: int
) -> None:
    reader, base = READERS[endpoint]
    head = json.dumps(base)[:-1]
    raw = f'{head}, "{name}": {nested(kind, depth)}}}'.encode()
    handled(raw, reader)


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("endpoint", sorted(READERS))
def test_a_whole_body_nested_up_to_the_body_limit_is_refused_at_once(
    endpoint: str, kind: str
) -> None:
    raw = nested(kind, 4 * MIB // 6).encode()  # about 4 MiB of brackets
    error = handled(raw, READERS[endpoint][0])
    assert error is not None and "nested too deeply" in str(error)


def _tool_call_arguments(text: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": text}}
    turns = [{"role": "user", "content": "x"},
             {"role": "assistant", "content": None, "tool_calls": [call]}]  # fmt: skip
    return {"model": MODEL, "messages": turns}


def _structured_outputs_json(text: str) -> dict[str, Any]:
    base = READERS["chat"][1]
    return base | {"structured_outputs": {"json": text}}


EMBEDDED: dict[str, Callable[[str], dict[str, Any]]] = {
    "a tool call's arguments": _tool_call_arguments,
    "structured_outputs.json": _structured_outputs_json,
}
"""JSON texts inside a body that the chat reader reads as JSON in turn."""

json_texts = st.one_of(
    st.builds(nested, st.sampled_from(["array", "object"]), st.integers(1, 3000)),
    st.sampled_from(["1" * 5000, '{"a": ' + "9" * 4301 + "}", "[" * 100_000, "{", "", "1e400"]),
    st.text(max_size=40),
)


@HOSTILE
@given(st.sampled_from(sorted(EMBEDDED)), json_texts)
def test_a_json_text_inside_a_body_is_read_or_refused(where: str, text: str) -> None:
    """A JSON text a field holds is read by the same bounded reader as the body: nested past
    Python's reader or with a number past 4,300 digits, a 400 (it was a 500: RecursionError,
    ValueError)."""
    handled(json.dumps(EMBEDDED[where](text)).encode(), READERS["chat"][0])


numbers = st.one_of(
    st.integers(),
    st.integers(10**300, 10**4000),
    st.integers(-(10**4000), -(10**300)),
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "1" * 5000, "-" + "9" * 4301]),
)


def _number_text(value: int | str) -> str:
    return value if isinstance(value, str) else str(value)


SAMPLING = [
    "temperature", "top_p", "max_tokens", "seed", "n", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "min_tokens", "logprobs",
]  # fmt: skip


@HOSTILE
@given(st.sampled_from(sorted(READERS)), st.sampled_from(SAMPLING), numbers)
def test_any_number_in_a_sampling_field_is_read_or_refused(
    endpoint: str, name: str, value: int | str
) -> None:
    reader, base = READERS[endpoint]
    if endpoint == "responses" and name in ("max_tokens", "n", "logprobs"):
        name = "max_output_tokens"
    raw = f'{json.dumps(base)[:-1]}, "{name}": {_number_text(value)}}}'.encode()
    handled(raw, reader)


keys = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(categories=("Nd", "No")), min_size=1, max_size=6),  # other digits
    st.from_regex(r"-{0,3}[0-9]{1,30}", fullmatch=True),
    st.just("9" * 5000),
)


@HOSTILE
@given(
    st.sampled_from(sorted(READERS)),
    st.dictionaries(keys, numbers, max_size=6),
)
def test_any_logit_bias_is_read_or_refused(endpoint: str, bias: dict[str, int | str]) -> None:
    reader, base = READERS[endpoint]
    pairs = ", ".join(f"{json.dumps(k)}: {_number_text(v)}" for k, v in bias.items())
    raw = f'{json.dumps(base)[:-1]}, "logit_bias": {{{pairs}}}}}'.encode()
    handled(raw, reader)


def test_the_keys_and_values_that_were_500s_are_400s_and_a_bias_is_clamped_as_vllm_does() -> None:
    reader, base = READERS["completions"]
    for key in ("²", "--1", "9" * 5000, "\u0661", " 1", "+1", "1_0"):  # \u0661: Arabic-Indic 1
        error = handled(json.dumps(base | {"logit_bias": {key: 1}}).encode(), reader)
        assert error is not None and "'logit_bias' must map token ids to numbers" in str(error)
    huge = f'{json.dumps(base)[:-1]}, "logit_bias": {{"5": 1{"0" * 400}, "6": -1e400}}}}'
    job = reader(json_object(huge.encode(), "request body"))
    assert job.choices[0].params.logit_bias == ((5, 100.0), (6, -100.0))  # type: ignore[attr-defined]


@HOSTILE
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_any_bytes_are_a_json_object_or_a_client_error(raw: bytes) -> None:
    handled(raw, lambda body: body)


@HOSTILE
@given(
    st.text(max_size=40)
    | st.from_regex(r"-?[0-9]{1,40}", fullmatch=True)
    | st.just("9" * 5000)
    | st.text(st.characters(categories=("Nd", "No")), min_size=1, max_size=5)
)
def test_starting_after_is_a_sequence_number_or_a_client_error(raw: str) -> None:
    outcome = timed(sequence_number, raw)
    BUDGET.check("starting_after", len(raw.encode()), outcome.spent)
    if outcome.error is not None:
        assert isinstance(outcome.error, ClientError), repr(outcome.error)
        assert outcome.error.param == "starting_after"
    else:
        assert outcome.result == int(raw) and outcome.result >= -1
