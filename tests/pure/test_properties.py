"""Property-based tests (Hypothesis) of every pure codec and parser a client's bytes reach: SSE
framing, the KServe tensor codec, the header and request-id rules, request validation, and the
cancel contract's bodies. Each either round-trips or refuses with the error the API maps to a
clear 4xx; nothing else may escape (an escaping exception is a 500 for the client)."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_server.engine.base import FinishReason
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.errors import InvalidRequest
from gateway_server.grpc.tensors import decode_bytes_tensor, decode_request, encode_bytes_tensor
from gateway_server.http.openai import StreamEvents
from gateway_server.openai.fields import SAMPLING_FIELDS
from gateway_server.openai.request import messages as chat_messages
from gateway_server.requests import TOKEN_BUDGET_CHAT, sampling_params
from gateway_server.sse import Event, SSEDecoder, encode
from hangup_contract import request_id
from hangup_contract.cancel import (
    CancelAnswer,
    cancel_path,
    cancelled_id,
    encode_request,
    parse_request,
)
from hangup_contract.cancel_labels import Reason
from hangup_contract.protos import inference_pb2 as pb
from proxy.calls.request_ids import RequestIds, choose_request_ids
from proxy.errors import BadRequestId
from proxy.http.headers import (
    HOP_BY_HOP,
    add_ids,
    client_response_head,
    upstream_request_headers,
)

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_text = st.text(st.characters(blacklist_categories=("Cs",)))
line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@SETTINGS
@given(
    any_text,
    any_text,
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=127),
    st.none() | st.sampled_from(FinishReason),
    st.booleans(),
    st.none() | json_values,
)
def test_a_streamed_chunk_is_the_json_of_the_whole_chunk(
    text: str, model: str, created: int, index: int, finish: FinishReason | None, chat: bool,
    logprobs: Any,
) -> None:  # fmt: skip
    """The pre-encoded chunk events are byte for byte what encoding each chunk whole gives,
    with log-probabilities or without."""
    envelope = {"id": f"cmpl-{model[::-1]}", "object": "text_completion", "created": created,
                "model": model}  # fmt: skip
    content: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
    choice = {"index": index, **content, "logprobs": logprobs,
              "finish_reason": finish and finish.value}  # fmt: skip
    whole = encode(json.dumps(envelope | {"choices": [choice]}))
    given = None if logprobs is None else json.dumps(logprobs)
    assert StreamEvents(envelope, chat=chat).chunk(index, text, finish, given) == whole


@SETTINGS
@given(
    st.lists(st.tuples(any_text, st.none() | line, st.none() | line), max_size=6),
    st.lists(st.integers(min_value=0), max_size=8),
)
def test_sse_events_survive_any_split(
    events: list[tuple[str, str | None, str | None]], cuts: list[int]
) -> None:
    wire = b"".join(encode(data, event=name, id=eid) for data, name, eid in events)
    decoder = SSEDecoder()
    got = [e for chunk in _split(wire, cuts) for e in decoder.feed(chunk)]
    expected, last_id = [], None
    for data, name, eid in events:
        last_id = eid if eid is not None else last_id  # an id stays until another replaces it
        expected.append(Event(data.replace("\r\n", "\n").replace("\r", "\n"), name, last_id))
    assert got == expected


@SETTINGS
@given(st.binary(max_size=64), st.lists(st.integers(min_value=0), max_size=6))
def test_sse_decoder_takes_any_bytes(data: bytes, cuts: list[int]) -> None:
    decoder = SSEDecoder()
    for chunk in _split(data, cuts):
        assert all(isinstance(e.data, str) for e in decoder.feed(chunk))


@SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_bytes_tensors_round_trip(elements: list[bytes]) -> None:
    assert decode_bytes_tensor(encode_bytes_tensor(elements), "x") == elements


@SETTINGS
@given(st.binary(max_size=64))
def test_any_raw_bytes_tensor_decodes_or_is_refused(raw: bytes) -> None:
    try:
        decode_bytes_tensor(raw, "text_input")
    except InvalidRequest as exc:
        assert "text_input" in exc.message


_NAMES = st.sampled_from(["text_input", "stream", "sampling_parameters",
                          "exclude_input_in_output", "other"])  # fmt: skip
_TYPES = st.sampled_from(["BYTES", "BOOL", "INT32", ""])


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 4))):
        tensor = request.inputs.add(name=draw(_NAMES), datatype=draw(_TYPES), shape=[1])
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=24)))
        elif tensor.datatype == "BOOL":
            tensor.contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=2)))
        else:
            tensor.contents.bytes_contents.extend(
                draw(st.lists(st.binary(max_size=24), max_size=2))
            )
    if raw and draw(st.booleans()):
        request.raw_input_contents.append(b"extra")  # more raw contents than inputs
    return request


@SETTINGS
@given(infer_requests())
def test_any_infer_request_decodes_or_is_refused_by_name(request: pb.ModelInferRequest) -> None:
    try:
        decoded = decode_request(request)
    except InvalidRequest as exc:
        assert exc.message
    else:
        assert isinstance(decoded.prompt, str) and isinstance(decoded.sampling, dict)


@SETTINGS
@given(st.text(max_size=140))
def test_the_id_rule_is_exactly_its_pattern(candidate: str) -> None:
    assert request_id.is_valid(candidate) == bool(
        re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", candidate)
    )


@SETTINGS
@given(st.text(max_size=60))
def test_any_id_is_one_path_segment_of_the_cancel_call(call_id: str) -> None:
    segment = cancel_path(call_id).removeprefix("/v2/requests/").removesuffix("/cancel")
    assert not set(segment) & set("/?#") and unquote(segment) == call_id
    if call_id:  # and the proxy's own cancel API reads it back (an empty id is no path)
        assert cancelled_id(cancel_path(call_id) + "?q=1") == call_id


_HEADER_NAMES = st.sampled_from(["X-Request-Id", "Connection", "Keep-Alive", "X-Other",
                                 "Transfer-Encoding", "TE", "x-request-id", "Upgrade"])  # fmt: skip


@SETTINGS
@given(st.lists(st.tuples(_HEADER_NAMES, line), max_size=6), st.booleans())
def test_request_ids_follow_the_rule_or_are_refused(
    headers: list[tuple[str, str]], trust: bool
) -> None:
    try:
        ids = choose_request_ids(headers, trust_client=trust)
    except BadRequestId:
        assert trust
    else:
        assert request_id.is_valid(ids.upstream)


# A field's name has no colon (the parser ends the name at the first one).
_NAME = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters=":"),
                min_size=1, max_size=8)  # fmt: skip


@st.composite
def _naming_some(
    draw: st.DrawFn, fields: st.SearchStrategy[list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    """``fields``, often with a ``Connection`` field put among them that names some of them (in
    another case at times), so that the rule for what ``Connection`` names is exercised."""
    out = draw(fields)
    if draw(st.booleans()) and out:
        spelt = [spelling for name, _ in out for spelling in (name, name.upper())]
        value = ", ".join(draw(st.lists(st.sampled_from(spelt), min_size=1, max_size=3)))
        out.insert(draw(st.integers(0, len(out))), ("Connection", value))
    return out


def _named_in_connection(fields: list[tuple[str, str]]) -> set[str]:
    """The names that ``fields``' ``Connection`` fields list, lower-cased (RFC 9110 §7.6.1)."""
    return {
        token.strip().lower()
        for name, value in fields
        if name.lower() == "connection"
        for token in value.split(",")
        if token.strip()
    }


def _named_in_connection_bytes(fields: list[tuple[bytes, bytes]]) -> set[bytes]:
    """The same, of fields as the parser gives them (bytes, lower-cased as ASCII)."""
    return {
        token.strip().lower()
        for name, value in fields
        if name.lower() == b"connection"
        for token in value.split(b",")
        if token.strip()
    }


@SETTINGS
@given(
    _naming_some(st.lists(st.tuples(_HEADER_NAMES | _NAME, line), max_size=8)),
    st.none() | st.just("10.0.0.9"),
)
def test_no_hop_by_hop_field_is_relayed(headers: list[tuple[str, str]], client: str | None) -> None:
    """Neither way does a hop-by-hop field, or one that ``Connection`` names, get past the proxy;
    of what it sends on, only the fields that it sets itself may bear such a name."""
    head = upstream_request_headers(headers, client_addr=client, scheme="http")
    sent = {name.lower() for name, _ in head.upstream}
    set_by_proxy = {"x-forwarded-for", "x-forwarded-proto"}
    assert not sent & (HOP_BY_HOP | _named_in_connection(headers)) - set_by_proxy

    fields = [(name.encode(), value.encode()) for name, value in headers]
    lines = client_response_head(fields, request_id="call-1").lines
    assert lines[-2:] == [b"X-Request-Id: call-1", b"Server: hangup-proxy"]  # the proxy's own
    relayed = {line.partition(b":")[0].lower() for line in lines[:-2]}
    hops = {name.encode() for name in HOP_BY_HOP}
    assert not relayed & (hops | _named_in_connection_bytes(fields))


_FORWARDING = st.sampled_from(["X-Forwarded-For", "x-forwarded-proto", "Expect", "Server",
                               "X-Client-Request-Id"])  # fmt: skip
_FIELDS = _naming_some(st.lists(st.tuples(_HEADER_NAMES | _FORWARDING | _NAME, line), max_size=8))


@SETTINGS
@given(_FIELDS, st.none() | st.just("10.0.0.9"), st.sampled_from(["http", "https"]))
def test_request_headers_upstream_are_the_clients_less_what_is_not_theirs_to_send(
    headers: list[tuple[str, str]], client: str | None, scheme: str
) -> None:
    """In order, every field of the client's but the hop-by-hop ones (those ``Connection``
    names too), ``Expect``, the ids and, when the client's address is known, the forwarding
    chain; then the chain extended by that address, the scheme unless the client named one,
    and the ids."""
    head = upstream_request_headers(headers, client_addr=client, scheme=scheme)
    add_ids(head.upstream, RequestIds("call-1", "c-1"))
    out = head.upstream
    dropped = HOP_BY_HOP | _named_in_connection(headers)
    dropped |= {"expect", "x-request-id", "x-client-request-id"}
    kept = [(n, v) for n, v in headers if n.lower() not in dropped]
    chain = [v for n, v in kept if n.lower() == "x-forwarded-for"]
    if client:
        kept = [(n, v) for n, v in kept if n.lower() != "x-forwarded-for"]
        kept.append(("X-Forwarded-For", f"{chain[0]}, {client}" if chain and chain[0] else client))
    if not any(n.lower() == "x-forwarded-proto" for n, _ in kept):
        kept.append(("X-Forwarded-Proto", scheme))
    assert out == [*kept, ("X-Request-Id", "call-1"), ("X-Client-Request-Id", "c-1")]
    ids = [v for n, v in headers if n.lower() == "x-request-id"]
    expects = [v for n, v in headers if n.lower() == "expect"]
    assert (head.request_id, head.expect) == (next(iter(ids), None), next(iter(expects), None))


_RESPONSE_NAMES = st.sampled_from(["Server", "Content-Length", "Date", "content-length"])
_RESPONSE_FIELDS = _naming_some(
    st.lists(st.tuples(_HEADER_NAMES | _RESPONSE_NAMES | _NAME, line), max_size=8)
).map(lambda fields: [(name.encode(), value.encode()) for name, value in fields])


@SETTINGS
@given(_RESPONSE_FIELDS)
def test_response_headers_to_the_client_are_the_upstreams_less_its_name_and_hops(
    fields: list[tuple[bytes, bytes]],
) -> None:
    """In order and as they came, every field of the upstream's but the hop-by-hop ones (those
    ``Connection`` names too), its id and its ``Server``; then the call's id and the proxy's
    name; and whether what is kept names the length and the date (the server adds them if not)."""
    head = client_response_head(fields, request_id="call-1")
    hops = {name.encode() for name in HOP_BY_HOP}
    dropped = hops | _named_in_connection_bytes(fields) | {b"x-request-id", b"server"}
    kept = [(n, v) for n, v in fields if n.lower() not in dropped]
    assert head.lines == [
        *(n + b": " + v for n, v in kept),
        b"X-Request-Id: call-1",
        b"Server: hangup-proxy",
    ]
    assert head.sized == any(n.lower() == b"content-length" for n, _ in kept)
    assert head.dated == any(n.lower() == b"date" for n, _ in kept)


@SETTINGS
@given(st.sampled_from(list(Reason)))
def test_every_reason_round_trips(reason: Reason) -> None:
    assert parse_request(encode_request(reason)) is reason


@SETTINGS
@given(st.binary(max_size=80) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_cancel_body_names_a_reason_or_is_refused(body: bytes) -> None:
    try:
        assert isinstance(parse_request(body), Reason)
    except ValueError as exc:
        assert str(exc)


@SETTINGS
@given(st.text(max_size=80) | json_values.map(json.dumps)
       | st.dictionaries(st.sampled_from(["state", "phase", "generated_tokens", "request_id"]),
                         json_values).map(json.dumps))  # fmt: skip
def test_any_cancel_answer_parses_or_is_refused(text: str) -> None:
    try:
        answer = CancelAnswer.from_json(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert CancelAnswer.from_json(json.dumps(answer.to_json())) == answer


_SAMPLING_KEYS = st.sampled_from([*SAMPLING_FIELDS, "other"])
_SIM = SimulatedEngine(SimConfig())


@SETTINGS
@given(st.dictionaries(_SAMPLING_KEYS, json_values, max_size=6))
def test_any_sampling_body_is_valid_or_refused_by_field(body: dict[str, Any]) -> None:
    try:
        params = sampling_params(
            body, _SIM, max_model_len=4096, default_max_tokens=16, budget=TOKEN_BUDGET_CHAT
        )
    except InvalidRequest as exc:
        assert exc.param in SAMPLING_FIELDS
    else:
        assert 1 <= params.max_tokens <= 4096 and 0 <= params.temperature <= 2
        assert 0 < params.top_p <= 1 and len(params.stop) <= 4
        assert 0 <= params.min_tokens <= params.max_tokens and params.repetition_penalty > 0


@SETTINGS
@given(st.dictionaries(st.just("messages"), json_values | st.lists(
    st.dictionaries(st.sampled_from(["role", "content"]), json_values | st.sampled_from(
        ["user", "system", "assistant"])), max_size=3)))  # fmt: skip
def test_any_chat_messages_are_read_or_refused(body: dict[str, Any]) -> None:
    try:
        messages = chat_messages(body)
    except InvalidRequest as exc:
        assert exc.param == "messages"
    else:
        assert messages and all(isinstance(m["content"], str) for m in messages)
