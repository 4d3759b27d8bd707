"""KServe v2 tensors ↔ the text model's request and response, byte by byte (no I/O)."""

from __future__ import annotations

import json
import re

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
        ({"text_input": ("BYTES", encode_bytes_tensor([b"a", b"b"]))}, "one element, not 2"),
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
