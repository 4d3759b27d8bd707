"""KServe v2 tensors ↔ the text model's request and response, byte by byte (no I/O)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gateway_server.errors import InvalidRequest
from gateway_server.grpc.tensors import (
    decode_bytes_tensor,
    decode_request,
    encode_bytes_tensor,
    parameter,
    text_response,
)
from hangup_contract.protos import inference_pb2 as pb


def raw_request(**tensors: tuple[str, bytes]) -> pb.ModelInferRequest:
    """A request whose tensors travel in raw_input_contents, as tritonclient sends them."""
    request = pb.ModelInferRequest(model_name="m", id="7")
    for name, (datatype, data) in tensors.items():
        request.inputs.add(name=name, datatype=datatype, shape=[1])
        request.raw_input_contents.append(data)
    return request


def test_bytes_tensor_round_trip_at_every_split() -> None:
    elements = [b"", b"hello", "é".encode(), b"\x00" * 300]
    raw = encode_bytes_tensor(elements)
    assert raw[:4] == b"\x00\x00\x00\x00" and raw[4:8] == b"\x05\x00\x00\x00"
    assert decode_bytes_tensor(raw, "x") == elements
    for cut in range(1, len(raw)):
        if cut in (4, 13, 19):  # the element boundaries: a shorter tensor, still whole
            continue
        with pytest.raises(InvalidRequest, match="'x'"):
            decode_bytes_tensor(raw[:cut], "x")


def test_raw_inputs_decode_into_a_text_request() -> None:
    request = raw_request(
        text_input=("BYTES", encode_bytes_tensor([b"Hi"])),
        stream=("BOOL", b"\x01"),
        sampling_parameters=(
            "BYTES",
            encode_bytes_tensor([json.dumps({"max_tokens": 3}).encode()]),
        ),
        exclude_input_in_output=("BOOL", b"\x00"),
    )
    text = decode_request(request)
    assert (text.prompt, text.stream, text.sampling, text.exclude_input_in_output) == (
        "Hi", True, {"max_tokens": 3}, False,
    )  # fmt: skip


def test_typed_contents_decode_too() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"typed")
    flag = request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(True)
    text = decode_request(request)
    assert (text.prompt, text.stream, text.sampling) == ("typed", True, {})


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({}, "'text_input' (BYTES) is required"),
        ({"text_input": ("INT32", b"\x00\x00\x00\x00")}, "must be BYTES, not INT32"),
        ({"text_input": ("BYTES", encode_bytes_tensor([b"a", b"b"]))},
         "unexpected number of string elements 2 for inference input 'text_input' for model "
         "'m', expecting 1"),
        ({"text_input": ("BYTES", encode_bytes_tensor([b"\xff"]))}, "not valid UTF-8"),
        ({"prompt": ("BYTES", encode_bytes_tensor([b"a"]))}, "unknown input 'prompt'"),
        (
            {"text_input": ("BYTES", encode_bytes_tensor([b"a"])),
             "sampling_parameters": ("BYTES", encode_bytes_tensor([b"{nope"]))},
            "not valid JSON",
        ),
        (
            {"text_input": ("BYTES", encode_bytes_tensor([b"a"])),
             "sampling_parameters": ("BYTES", encode_bytes_tensor([b"[1]"]))},
            "must be a JSON object",
        ),
    ],
)  # fmt: skip
def test_malformed_requests_name_the_problem(
    tensors: dict[str, tuple[str, bytes]], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        decode_request(raw_request(**tensors))


def _shaped(shape: list[int], raw: bytes | None = None, typed: list[bytes] | None = None) -> Any:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    for element in typed or ():
        tensor.contents.bytes_contents.append(element)
    return request


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_shaped([2], raw=encode_bytes_tensor([b"a"])),
         "unexpected shape for input 'text_input' for model 'm'. Expected [1], got [2]."),
        (_shaped([1, 1], raw=encode_bytes_tensor([b"a"])), "Expected [1], got [1,1]."),
        (_shaped([], raw=encode_bytes_tensor([b"a"])), "Expected [1], got []."),
        (_shaped([1] * 20, raw=encode_bytes_tensor([b"a"])), "got [1,1,1,1,1,1,1,1...]."),
        (_shaped([-1], raw=encode_bytes_tensor([b"a"])),
         "All input dimensions should be specified for input 'text_input' for model 'm', "
         "got [-1]"),
        (_shaped([1], raw=b""),
         "expected 1 string elements for inference input 'text_input' for model 'm', got 0"),
        (_shaped([1], typed=[]), "expected 1 string elements"),
        (_shaped([1], typed=[b"a", b"b", b"c"]), "unexpected number of string elements 2"),
        (_shaped([1], raw=b"\x05\x00"),
         "incomplete string length indicator for inference input 'text_input' for model 'm', "
         "expecting 4 bytes but only 2 bytes available."),
        (_shaped([1], raw=encode_bytes_tensor([b"a"]) + b"\x00\x00"),
         "expecting 4 bytes but only 2 bytes available"),
        (_shaped([1], raw=b"\x09\x00\x00\x00abc"),
         "incomplete string data for inference input 'text_input', expecting string of length 9 "
         "but only 3 bytes available"),
        (_shaped([1], raw=encode_bytes_tensor([b"a"]), typed=[b"b"]),
         "contents field must not be specified when using raw_input_contents for 'text_input' "
         "for model 'm'"),
    ],
)  # fmt: skip
def test_tensors_are_held_to_their_framing_in_tritons_words(request_: Any, message: str) -> None:
    """The checks Triton 2.51 makes of the same inputs, worded as it words them (each case's
    words were read from a real Triton serving a model with these inputs)."""
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        decode_request(request_)


def test_bool_tensors_are_one_byte_or_one_typed_element() -> None:
    for raw in (b"", b"\x01\x01"):
        request = raw_request(
            text_input=("BYTES", encode_bytes_tensor([b"a"])), stream=("BOOL", raw)
        )
        with pytest.raises(InvalidRequest, match=re.escape(
            f"input byte size mismatch for input 'stream' for model 'm'. Expected 1, got {len(raw)}"
        )):  # fmt: skip
            decode_request(request)
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"a"
    )
    typed.inputs.add(name="stream", datatype="BOOL", shape=[1]).contents.bool_contents.extend(
        [True, True]
    )
    with pytest.raises(InvalidRequest, match="Expected 1, got 2"):
        decode_request(typed)


def test_a_clients_strings_are_quoted_cut_short() -> None:
    request = raw_request(**{"n" * 10_000: ("BYTES", encode_bytes_tensor([b"a"]))})
    with pytest.raises(InvalidRequest) as refused:
        decode_request(request)
    assert "(10000 characters)" in refused.value.message and len(refused.value.message) < 200


def test_raw_contents_must_match_the_inputs() -> None:
    request = raw_request(text_input=("BYTES", encode_bytes_tensor([b"a"])))
    request.raw_input_contents.append(b"extra")
    with pytest.raises(InvalidRequest, match="2 raw_input_contents for 1 inputs"):
        decode_request(request)


def test_unknown_requested_output_is_refused() -> None:
    request = raw_request(text_input=("BYTES", encode_bytes_tensor([b"a"])))
    request.outputs.add(name="logits")
    with pytest.raises(InvalidRequest, match="unknown output 'logits'"):
        decode_request(request)
    request.outputs[0].name = "text_output"
    request.outputs.add(name="text_output")
    with pytest.raises(InvalidRequest, match="2 outputs requested"):
        decode_request(request)


def test_parameters_of_every_kind() -> None:
    request = pb.ModelInferRequest()
    request.parameters["sequence_id"].int64_param = 42
    request.parameters["name"].string_param = "s"
    request.parameters["flag"].bool_param = True
    assert parameter(request, "sequence_id") == 42
    assert parameter(request, "name") == "s"
    assert parameter(request, "flag") is True
    assert parameter(request, "absent") is None


def test_text_response_carries_the_text_and_parameters() -> None:
    response = text_response("m", "1", "7", "héllo", {"triton_final_response": True, "n": 2})
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("text_output", "BYTES", [1])
    ]
    assert decode_bytes_tensor(response.raw_output_contents[0], "t") == ["héllo".encode()]
    assert response.parameters["triton_final_response"].bool_param is True
    assert response.parameters["n"].int64_param == 2
    empty = text_response("m", "1", "7", None, {"triton_final_response": True})
    assert not empty.outputs and not empty.raw_output_contents
