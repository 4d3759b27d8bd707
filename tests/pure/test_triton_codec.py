"""The Triton bridge's codec (``proxy.triton.codec``): the generate extension's JSON as KServe v2
messages and back, for every datatype generate can carry (no I/O; the real Triton is in
``tests/triton/test_triton_bridge.py``)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hangup_contract.protos import inference_pb2 as pb
from proxy.triton.bridge import stream_event
from proxy.triton.codec import (
    NESTED,
    TOO_BIG,
    GenerateError,
    ModelInputs,
    answer,
    encode,
    generate_request,
    number_text,
    parse_body,
)
from proxy.triton.infer import HEADER_LENGTH, infer_answer, infer_request
from proxy.triton.tensors import checked, packed

NUMBERS = {  # datatype: (contents field, struct code, values)
    "INT8": ("int_contents", "b", [-3, 4]), "INT16": ("int_contents", "h", [-300, 4]),
    "INT32": ("int_contents", "i", [-70000, 4]), "INT64": ("int64_contents", "q", [-(2**40), 4]),
    "UINT8": ("uint_contents", "B", [3, 250]), "UINT16": ("uint_contents", "H", [3, 60000]),
    "UINT32": ("uint_contents", "I", [3, 2**31]), "UINT64": ("uint64_contents", "Q", [3, 2**63]),
    "FP32": ("fp32_contents", "f", [1.5, -0.25]), "FP64": ("fp64_contents", "d", [0.1, 2.5]),
}  # fmt: skip
TYPES = {"text": "BYTES", "flag": "BOOL"} | {name.lower(): name for name in NUMBERS}
MODEL = ModelInputs("m", "", TYPES, decoupled=False)


@pytest.mark.parametrize("datatype", NUMBERS)
def test_numbers_go_up_in_their_contents_field_and_come_back_as_json(datatype: str) -> None:
    field, code, values = NUMBERS[datatype]
    request = generate_request(MODEL, {datatype.lower(): values})
    (tensor,) = request.inputs
    assert (tensor.datatype, list(tensor.shape)) == (datatype, [2])
    assert list(getattr(tensor.contents, field)) == values
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="out", datatype=datatype, shape=[2])
    response.raw_output_contents.append(struct.pack(f"<2{code}", *values))
    assert answer(response) == {"model_name": "m", "model_version": "1", "out": values}


def test_text_and_flags_scalars_and_the_order_triton_writes() -> None:
    parameters = {"n": 2, "x": 0.5, "s": "y", "b": False}
    request = generate_request(
        MODEL, {"text": "é", "flag": True, "ignored": 1, "parameters": parameters}
    )
    assert [(t.name, list(t.shape)) for t in request.inputs] == [("text", [1]), ("flag", [1])]
    assert request.inputs[0].contents.bytes_contents == ["é".encode()]
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in request.parameters.items()}
    assert kinds == {"n": "int64_param", "x": "double_param", "s": "string_param",
                     "b": "bool_param"}  # fmt: skip
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="t", datatype="BYTES", shape=[1])
    response.outputs.add(name="f", datatype="BOOL", shape=[2])
    response.raw_output_contents.extend([struct.pack("<I", 2) + "é".encode(), b"\x01\x00"])
    assert (
        encode(answer(response))
        == '{"model_name":"m","model_version":"1","t":"é","f":[true,false]}'.encode()
    )
    assert list(answer(response, outputs_first=True)) == ["t", "f", "model_name", "model_version"]


@pytest.mark.parametrize(
    ("body", "named"),
    [({"text": 5}, "text"), ({"flag": "yes"}, "flag"), ({"int32": 1.5}, "int32"),
     ({"fp32": True}, "fp32"), ({"parameters": [1]}, "parameters"),
     ({"parameters": {"p": [1]}}, "p")],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_refused_naming_it(
    body: dict[str, object], named: str
) -> None:
    with pytest.raises(GenerateError, match=named) as refused:
        generate_request(MODEL, body)
    assert refused.value.status == 400


@pytest.mark.parametrize("raw", [b"", b"[1]", b"{", b"\xff"])
def test_a_body_that_is_no_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(GenerateError) as refused:
        parse_body(raw)
    assert refused.value.status == 400


def _stdlib_parse_body(raw: bytes) -> dict[str, object]:
    """``parse_body`` as it was before msgspec read the body, what json raises on (nesting past
    the recursion limit, an integer past the digit limit) refused in Triton's shape."""
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GenerateError(400, f"failed to parse the request JSON buffer: {exc}") from exc
    except RecursionError as exc:
        raise GenerateError(400, f"failed to parse the request JSON buffer: {NESTED}") from exc
    except ValueError as exc:
        raise GenerateError(400, TOO_BIG) from exc
    if not isinstance(body, dict):
        raise GenerateError(400, "the request body must be a JSON object")
    return body


def _read(parse: Callable[[bytes], object], raw: bytes) -> object:
    """What a parser makes of ``raw``: the value's repr (which tells -0.0 from 0.0, a NaN, True
    from 1, and keeps the keys' order), or its refusal."""
    try:
        return repr(parse(raw))
    except GenerateError as exc:
        return ("refused", exc.status, exc.message)
    except (ValueError, RecursionError) as exc:
        return (type(exc).__name__, str(exc))


_BODY_LEAVES = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(width=32)
    | st.integers(-(2**80), 2**80)
    | st.booleans()
    | st.text(max_size=6)
    | st.none()
)
_BODIES = st.recursive(
    _BODY_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=25,
)
# Text that is nearly JSON: the tokens, numbers of every form, escapes, control characters,
# non-ASCII, NaN and Infinity, so that the invalid and the odd come up as often as the valid.
_NEARLY_JSON = st.lists(
    st.sampled_from(
        [
            "{",
            "}",
            "[",
            "]",
            '"',
            ",",
            ":",
            " ",
            "\n",
            "\t",
            "\x0c",
            "\x01",
            "\x7f",
            "é",
            "\u2028",
            "\\u",
            "d834",
            "\\ud800",
            '\\"',
            "\\n",
            "-",
            "0",
            "1",
            "9",
            ".",
            "e",
            "E",
            "+",
            "1e400",
            "1e-400",
            "12345678901234567890",
            "true",
            "false",
            "null",
            "NaN",
            "Infinity",
            "-Infinity",
            '"a"',
            '"a":',
        ]
    ),
    max_size=30,
).map("".join)


@given(
    _BODIES.map(lambda v: json.dumps({"k": v}, ensure_ascii=False).encode())
    | st.tuples(_BODIES, _BODIES).map(
        lambda t: f'{{"k": {json.dumps(t[0])}, "j": 1, "k": {json.dumps(t[1])}}}'.encode()
    )
    | st.tuples(
        _NEARLY_JSON.map(lambda text: '{"k": ' + text + "}") | _NEARLY_JSON,
        st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32", "utf-8-sig"]),
    ).map(lambda t: t[0].encode(t[1], errors="surrogatepass"))
    | st.binary(max_size=40)
)
def test_a_body_is_read_as_json_reads_it(raw: bytes) -> None:
    """msgspec reads the body, json again where msgspec refuses it: for any bytes, the value
    json.loads makes (the same types, floats and key order) or its refusal in its words."""
    assert _read(parse_body, raw) == _read(_stdlib_parse_body, raw)


@pytest.mark.parametrize(
    "raw",
    [b'{"a": NaN, "b": -Infinity}', b'{"a": 1e400}', b'{"a": 123456789012345678901234567890}',
     b'{"a": 1, "a": 2, "b": 3}', '{"é": 1}'.encode("utf-16"), b'\xef\xbb\xbf{"a": 1}',
     b'{"a": "\xed\xa0\x80"}', b'{"a": "\\udd1e"}', b'{"a": "\x01"}', b'{"a": 1,}',
     b'{"a": "\xff"}', b"[" * 100_000, b'{"a": ' + b"1" * 5000 + b"}"],
)  # fmt: skip
def test_bodies_msgspec_reads_otherwise_are_read_as_json_reads_them(raw: bytes) -> None:
    assert _read(parse_body, raw) == _read(_stdlib_parse_body, raw)


@pytest.mark.parametrize(
    ("value", "written"),
    [(246913584.0, "246913584.0"), (1e16, "10000000000000000.0"), (1e21, "1e21"),
     (1.5e-5, "0.000015"), (-1e-6, "-0.000001"), (1e-7, "1e-7"), (0.1, "0.1"), (-3.0, "-3.0")],
)  # fmt: skip
def test_floats_are_laid_out_as_rapidjson_lays_them_out(value: float, written: str) -> None:
    assert number_text(value) == written


def test_infer_binary_tensors_both_ways() -> None:
    head = json.dumps(
        {
            "id": "x",
            "inputs": [
                {
                    "name": "a",
                    "shape": [2],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 8},
                },
                {"name": "b", "shape": [1, 2], "datatype": "BYTES", "data": [["p", "q"]]},
            ],
            "outputs": [{"name": "o", "parameters": {"binary_data": True}}, {"name": "j"}],
        }
    ).encode()
    binary = struct.pack("<2i", 7, -8)
    model = ModelInputs("m", "", {"a": "INT32", "b": "BYTES"}, False, frozenset({"o", "j"}))
    request, wanted, every = infer_request(model, head + binary, str(len(head)))
    assert (request.id, [list(t.shape) for t in request.inputs]) == ("x", [[2], [1, 2]])
    assert request.raw_input_contents == [binary, b"\x01\x00\x00\x00p\x01\x00\x00\x00q"]
    assert (wanted, every, [o.name for o in request.outputs]) == ({"o"}, False, ["o", "j"])
    response = pb.ModelInferResponse(model_name="m", model_version="1", id="x")
    response.outputs.add(name="o", datatype="FP32", shape=[1])
    response.outputs.add(name="j", datatype="UINT8", shape=[2])
    response.raw_output_contents.extend([struct.pack("<f", 0.5), b"\x01\x02"])
    body, headers = infer_answer(response, wanted, every)
    text = (b'{"id":"x","model_name":"m","model_version":"1","outputs":['
            b'{"name":"o","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}},'
            b'{"name":"j","datatype":"UINT8","shape":[2],"data":[1,2]}]}')  # fmt: skip
    assert body == text + struct.pack("<f", 0.5)
    assert headers == {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}


@pytest.mark.parametrize(
    ("body", "length"),
    [({"inputs": [{"name": "a", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}, None),
     ({"inputs": [{"name": "a", "shape": [1], "datatype": "BF16", "data": [1]}]}, None),
     ({"inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": [300]}]}, None),
     ({"inputs": "no"}, None), ({"inputs": []}, "x"), ({"inputs": []}, "999")],
)  # fmt: skip
def test_an_infer_body_triton_could_not_read_is_refused(
    body: dict[str, object], length: str | None
) -> None:
    with pytest.raises(GenerateError) as refused:
        infer_request(ModelInputs("m", "", {"a": "FP32"}, False), json.dumps(body).encode(), length)
    assert refused.value.status == 400


def test_an_output_json_cannot_carry_is_an_error_event_naming_its_datatype() -> None:
    """A BF16 output has no JSON form: generate_stream writes an error event naming it (not a
    dropped stream), the events before it stand."""

    bf16 = pb.ModelInferResponse(model_name="m", model_version="1")
    bf16.outputs.add(name="OUT", datatype="BF16", shape=[1])
    bf16.raw_output_contents.append(b"\x80\x3f")
    message = pb.ModelStreamInferResponse(infer_response=bf16)
    assert json.loads(stream_event(message, first=False)) == {
        "error": "an output of datatype BF16 cannot be written as JSON"
    }
    text = pb.ModelInferResponse(model_name="m", model_version="1")
    text.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    text.raw_output_contents.append(struct.pack("<I", 2) + b"hi")
    ok = json.loads(stream_event(pb.ModelStreamInferResponse(infer_response=text), first=False))
    assert ok == {"model_name": "m", "model_version": "1", "text_output": "hi"}


def test_generate_writes_numbers_as_triton_writes_them() -> None:
    """rapidjson's exponent form (``1e-7``, ``2e20`` as a whole number), not Python's (``1e-07``,
    ``2e+20``), in a generate answer and a generate_stream event alike: a client comparing the
    text, or a float parser that refuses neither, sees what Triton sends."""
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="x", datatype="FP64", shape=[3])
    response.outputs.add(name="y", datatype="FP64", shape=[1])
    response.raw_output_contents.extend(
        [struct.pack("<3d", 1e-7, 2e20, 1e22), struct.pack("<d", -2.5e-9)]
    )
    written = (
        b'{"model_name":"m","model_version":"1",'
        b'"x":[1e-7,200000000000000000000.0,1e22],"y":-2.5e-9}'
    )
    assert encode(answer(response)) == written
    message = pb.ModelStreamInferResponse(infer_response=response)
    assert stream_event(message, first=False) == written


def _element_by_element(value: object) -> str:
    """The answer's JSON as the bridge wrote it before its lists went through json's encoder."""
    if isinstance(value, dict):
        items = (
            f"{json.dumps(k, ensure_ascii=False)}:{_element_by_element(v)}"
            for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_element_by_element(v) for v in value) + "]"
    if isinstance(value, float):
        return number_text(value)
    return json.dumps(value, ensure_ascii=False)


_INT64_EDGES = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 0]
_SCALARS = (
    st.floats(width=32)
    | st.floats()
    # every magnitude, with up to 17 significant digits: where layouts change (1e-7, 1e-5,
    # 1e16, 1e21) and beyond
    | st.tuples(st.integers(-(10**17), 10**17), st.integers(-345, 310)).map(
        lambda t: float(f"{t[0]}e{t[1]}")
    )
    | st.integers(-(2**100), 2**100)
    | st.sampled_from(_INT64_EDGES)
    | st.booleans()
    | st.text(max_size=8)  # non-ASCII, control characters and all
    | st.text(st.characters(max_codepoint=0x3F), max_size=4)  # controls and ASCII, often
    | st.none()
)


@given(
    st.lists(_SCALARS, max_size=40)
    | st.lists(st.lists(_SCALARS, max_size=5), max_size=5)
    | st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=160),
    st.text(max_size=6),
    st.dictionaries(st.text(max_size=4), _SCALARS, max_size=3),
)
def test_an_answer_is_written_as_element_by_element(
    data: list[object], name: str, parameters: dict[str, object]
) -> None:
    """msgspec writes a tensor's data where its text shows no exponent: for any data, names and
    parameters, the bytes of the element-by-element writer (rapidjson's layout)."""
    body = {
        "id": name,
        "model_name": "m",
        "parameters": parameters,
        "outputs": [{"name": name, "datatype": "FP32", "shape": [len(data)], "data": data}],
    }
    assert encode(body) == _element_by_element(body).encode()


_JSON_LEAVES = (
    st.floats(width=32)
    | st.floats()
    | st.integers(-(2**70), 2**70)
    | st.booleans()
    | st.text(max_size=3)
    | st.none()
)
_JSON_DATA = st.recursive(_JSON_LEAVES, lambda inner: st.lists(inner, max_size=6), max_leaves=20)


def _outcome(pack: Callable[[], bytes]) -> object:
    try:
        return pack()
    except GenerateError as exc:
        return ("refused", exc.status, exc.message)
    except (OverflowError, TypeError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


@given(
    st.sampled_from(["BOOL", "FP16", "BYTES", "BF16", *NUMBERS]),
    st.lists(st.integers(0, 4), max_size=3),
    _JSON_DATA,
)
def test_an_input_packed_at_once_is_packed_as_the_checked_way_packs_it(
    datatype: str, shape: list[int], data: object
) -> None:
    """``packed`` packs flat data of the right count in one call and leaves the rest to
    ``checked``: for any JSON data, the same bytes or the same refusal."""
    if isinstance(data, list) and data and all(not isinstance(v, list) for v in data):
        shape = [len(data)]  # the usual case, a flat list of the right count, comes up often
    fast = _outcome(lambda: packed("x", datatype, shape, data))
    slow = _outcome(lambda: checked("x", datatype, shape, data))
    assert fast == slow
