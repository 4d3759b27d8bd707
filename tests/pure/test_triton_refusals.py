"""What the Triton bridge makes of malformed input (issue 59): each body a client can send that
Triton refuses to read is a ``GenerateError`` (the bridge's 400 in Triton's ``{"error": ...}``
shape), in Triton's words where it has them, never another exception (which the HTTP server
answers 500 "the proxy failed", logging a traceback); what Triton reads, the bridge reads as
Triton does (an integer parameter beyond int64 is a double; FP32 data beyond a float's range is
infinity; binary data must fill its inputs exactly). Triton's own answers to the same bodies are
checked in ``tests/triton/test_triton_bridge.py``; the linear work in ``tests/hostile/``."""

from __future__ import annotations

import json
import math
import struct

import pytest

from proxy.triton.codec import GenerateError, ModelInputs, generate_request, parse_body
from proxy.triton.infer import HEADER_LENGTH, infer_request

# Triton's words (its HTTP frontend's, 2.51) for what it refuses
SURROGATE = "The surrogate pair in string is invalid."
TOO_BIG = "Number too big to be stored in double."
# A model of any input and output the bodies below name
INFER_MODEL = ModelInputs(
    "m", "", dict.fromkeys(["INPUT0", "I", "T", "\udfff"], "FP32"), False,
    frozenset({"o", "\ud800"}),
)  # fmt: skip
NOT_UNSIGNED = "attempt to access JSON non-unsigned-integer as unsigned-integer"


def _tensor(**fields: object) -> str:
    tensor = {"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]} | fields
    return json.dumps(tensor)


def _infer(head: str, *, inputs: str | None = None) -> bytes:
    text = head if inputs is None else f'{{"inputs": [{inputs}]{head}}}'
    return text.encode()


_ONE = '{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}'
INFER_REFUSED: list[tuple[str, bytes, str]] = [  # what, body, a part of the message
    ("shape 'a'", _infer("", inputs=_tensor(shape=["a"])), NOT_UNSIGNED),
    ("shape null", _infer("", inputs=_tensor(shape=[None])), NOT_UNSIGNED),
    ("shape 1e999", _infer("", inputs=_tensor(shape=[2]).replace("[2]", "[1e999]")),
     NOT_UNSIGNED),
    ("shape -1", _infer("", inputs=_tensor(shape=[-1])), NOT_UNSIGNED),
    ("shape 2.0", _infer("", inputs=_tensor(shape=[2.0])), NOT_UNSIGNED),
    ("shape true", _infer("", inputs=_tensor(shape=[True])), NOT_UNSIGNED),
    ("shape 2**63", _infer("", inputs=_tensor(shape=[2**63], data=[])), "beyond int64"),
    ("binary_data_size 'abc'",
     _infer("", inputs=json.dumps({"name": "I", "shape": [1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": "abc"}})),
     "Unable to parse 'binary_data_size'"),
    ("binary_data_size -1",
     _infer("", inputs=json.dumps({"name": "I", "shape": [1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": -1}})),
     "Unable to parse 'binary_data_size'"),
    ("data and binary_data_size",
     _infer("", inputs=_tensor(parameters={"binary_data_size": 8})), "But set 'data'"),
    ("a lone surrogate in the id", _infer('{"id": "\\ud800", "inputs": []}'), SURROGATE),
    ("a lone surrogate in a name",
     _infer("", inputs=_ONE.replace('"INPUT0"', '"\\udfff"')), SURROGATE),
    ("a lone surrogate in BYTES data",
     _infer("", inputs='{"name": "T", "shape": [1], "datatype": "BYTES", "data": ["\\ud800"]}'),
     SURROGATE),
    ("a lone surrogate in a parameter",
     _infer(', "parameters": {"p": "\\ud800"}', inputs=_ONE), SURROGATE),
    ("a lone surrogate naming a parameter",
     _infer(', "parameters": {"\\ud800": 1}', inputs=_ONE), SURROGATE),
    ("a lone surrogate naming an output",
     _infer(', "outputs": [{"name": "\\ud800"}]', inputs=_ONE), SURROGATE),
    ("a parameter beyond a double", _infer(f', "parameters": {{"p": {10**400}}}', inputs=_ONE),
     TOO_BIG),
    ("INT32 out of range",
     _infer("", inputs=_tensor(datatype="INT32", shape=[1], data=[2**40])), "INT32"),
    ("UINT8 out of range",
     _infer("", inputs=_tensor(datatype="UINT8", shape=[1], data=[-1])), "UINT8"),
    ("FP32 10**400", _infer("", inputs=_tensor(shape=[1], data=[10**400])), "FP32"),
    ("a 5,000-digit integer", _infer("", inputs=_ONE.replace("[1]}", f"[{'9' * 5000}]}}")),
     TOO_BIG),
    ("nesting 100,000 deep", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "nested too deeply"),
    ("data nested 5,000 deep", _infer("", inputs=_ONE.replace("[1]}", "[" * 5000 + "1" +
                                                              "]" * 5000 + "}")),
     "nested too deeply"),
    ("an id that is no string", _infer('{"id": 5, "inputs": []}'),
     "Unable to parse 'id': attempt to access JSON non-string as string"),
    ("a name that is missing", _infer("", inputs='{"shape": [1], "datatype": "FP32"}'),
     "non-existing object member 'name'"),
    ("binary_data that is no boolean",
     _infer(', "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]', inputs=_ONE),
     "Unable to parse 'binary_data'"),
    ("binary_data_output that is no boolean",
     _infer(', "parameters": {"binary_data_output": "yes"}', inputs=_ONE),
     "Unable to parse 'binary_data_output'"),
    ("FP16 as JSON", _infer("", inputs=_tensor(datatype="FP16", shape=[1], data=[1e6])),
     "receiving FP16 data via JSON is not supported"),
    ("no inputs", b"{}", "non-existing object member 'inputs'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "says"), [(b, s) for _, b, s in INFER_REFUSED], ids=[w for w, _, _ in INFER_REFUSED]
)
def test_a_malformed_infer_body_is_refused_in_triton_shape(body: bytes, says: str) -> None:
    with pytest.raises(GenerateError) as refused:
        infer_request(INFER_MODEL, body, None)
    assert refused.value.status == 400
    assert says in refused.value.message


def _framed(inputs: list[dict[str, object]], binary: bytes) -> tuple[bytes, str]:
    head = json.dumps({"inputs": inputs}).encode()
    return head + binary, str(len(head))


BINARY = {"name": "INPUT0", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}


@pytest.mark.parametrize(
    ("binary", "says"),
    [(b"\0" * 12, "unexpected additional input data for model 'm'"),
     (b"\0" * 4, "unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'm'")],
    ids=["longer than declared", "shorter than declared"],
)  # fmt: skip
def test_binary_data_must_fill_its_inputs_exactly(binary: bytes, says: str) -> None:
    """As Triton's HTTP frontend checks it: bytes after the last input are refused, not dropped."""
    raw, length = _framed([BINARY], binary)
    with pytest.raises(GenerateError) as refused:
        infer_request(INFER_MODEL, raw, length)
    assert (refused.value.status, refused.value.message) == (400, says)
    request, _, _ = infer_request(INFER_MODEL, *_framed([BINARY], b"\0" * 8))
    assert request.raw_input_contents == [b"\0" * 8]


@pytest.mark.parametrize("length", ["-1", "999", "abc", "9" * 5000, "١٢"])
def test_a_header_length_outside_the_body_is_refused(length: str) -> None:
    with pytest.raises(GenerateError) as refused:
        infer_request(INFER_MODEL, b'{"inputs": []}', length)
    assert refused.value.status == 400
    assert refused.value.message.startswith((HEADER_LENGTH, "inference header size"))


def test_what_triton_reads_the_bridge_reads_as_triton_does() -> None:
    """Integer parameters beyond int64 go up as doubles (Triton's gRPC takes no uint64 and its
    HTTP frontend reads them as rapidjson does, as doubles); FP32 data beyond a float's range is
    infinity (Triton answers 200 with Infinity); the dimensions of a shape of many dimensions are
    not multiplied past what the data holds (the count is refused, not computed)."""
    body = (f'{{"parameters": {{"a": {2**63}, "b": {-(2**63) - 1}, "c": {2**64}, "d": 5}}, '
            f'"inputs": [{_tensor(shape=[1], data=[1e300])}]}}').encode()  # fmt: skip
    request, _, _ = infer_request(INFER_MODEL, body, None)
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in request.parameters.items()}
    assert kinds == {"a": "double_param", "b": "double_param", "c": "double_param",
                     "d": "int64_param"}  # fmt: skip
    assert request.parameters["a"].double_param == 2.0**63
    assert struct.unpack("<f", request.raw_input_contents[0]) == (math.inf,)
    many = json.dumps({"inputs": [{"name": "I", "shape": [2] * 200_000, "datatype": "FP32",
                                   "data": [1, 2]}]}).encode()  # fmt: skip
    with pytest.raises(GenerateError, match="Shape does not match"):
        infer_request(INFER_MODEL, many, None)


MODEL = ModelInputs(
    "m", "", {"i32": "INT32", "u8": "UINT8", "f32": "FP32", "i64": "INT64", "text": "BYTES"},
    decoupled=False,
)  # fmt: skip
GENERATE_REFUSED: list[tuple[str, bytes, str]] = [
    ("INT32 out of range", b'{"i32": [4294967296]}', "INT32"),
    ("UINT8 out of range", b'{"u8": -1}', "UINT8"),
    ("INT64 out of range", b'{"i64": 9223372036854775808}', "INT64"),
    ("FP32 10**400", b'{"f32": 1' + b"0" * 400 + b"}", TOO_BIG),
    ("a 5,000-digit integer", b'{"i64": ' + b"9" * 5000 + b"}", TOO_BIG),
    ("nesting 3,000 deep", b'{"f32": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nested too deeply"),
    ("a lone surrogate in text", b'{"text": "\\ud800"}', SURROGATE),
    ("a lone surrogate in a parameter", b'{"parameters": {"a": "\\udfff"}}', SURROGATE),
    ("a lone surrogate naming a parameter", b'{"parameters": {"\\udfff": 1}}', SURROGATE),
    ("a parameter beyond a double", b'{"parameters": {"a": 1' + b"0" * 400 + b"}}", TOO_BIG),
]


@pytest.mark.parametrize(
    ("body", "says"),
    [(b, s) for _, b, s in GENERATE_REFUSED],
    ids=[w for w, _, _ in GENERATE_REFUSED],
)
def test_a_malformed_generate_body_is_refused_in_triton_shape(body: bytes, says: str) -> None:
    with pytest.raises(GenerateError) as refused:
        generate_request(MODEL, parse_body(body))
    assert refused.value.status == 400
    assert says in refused.value.message


def test_a_generate_parameter_beyond_int64_is_a_double() -> None:
    request = generate_request(MODEL, parse_body(b'{"parameters": {"a": 9223372036854775808}}'))
    assert request.parameters["a"].double_param == 2.0**63


def test_inputs_and_outputs_the_model_lacks_are_refused_before_the_next_is_read() -> None:
    """Triton's words for an input it does not know, an input given twice and an output it does
    not have; an output asked for twice is asked for once, as Triton takes it. A body of a
    million inputs or outputs is refused at the first that cannot be, not read to its end."""
    refused = {
        "unexpected inference input 'X' for model 'm'": [{"name": "X"}],
        "[request id: <id_unknown>] input 'I' already exists in request":
            [json.loads(_ONE) | {"name": "I"}] * 2,
    }  # fmt: skip
    for says, inputs in refused.items():
        with pytest.raises(GenerateError) as error:
            infer_request(INFER_MODEL, json.dumps({"inputs": inputs}).encode(), None)
        assert (error.value.status, error.value.message) == (400, says)
    outputs = [{"name": "o"}] * 3 + [{"name": "p"}]
    with pytest.raises(GenerateError) as error:
        infer_request(INFER_MODEL, json.dumps({"inputs": [], "outputs": outputs}).encode(), None)
    assert error.value.message == "unexpected inference output 'p' for model 'm'"
    body = json.dumps({"inputs": [], "outputs": outputs[:3]}).encode()
    request, _, _ = infer_request(INFER_MODEL, body, None)
    assert [o.name for o in request.outputs] == ["o"]


def test_a_refusal_quotes_at_most_a_kilobyte_of_the_request() -> None:
    """An input named with a megabyte was echoed whole in the 400 and in the call's log line."""
    body = json.dumps({"inputs": [{"name": "N" * (1 << 20)}]}).encode()
    with pytest.raises(GenerateError) as refused:
        infer_request(INFER_MODEL, body, None)
    assert refused.value.message.startswith("unexpected inference input 'NNN")
    assert len(refused.value.message) <= 1024
