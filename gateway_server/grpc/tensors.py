"""KServe v2 tensors in and out of protobuf messages, for the text-generation model. No I/O.

The model takes what Triton's vLLM backend takes, each a one-element tensor:

    text_input               BYTES  the prompt (UTF-8)                          required
    stream                   BOOL   one response per chunk instead of one at the end
    sampling_parameters      BYTES  a JSON object (max_tokens, temperature, …)
    exclude_input_in_output  BOOL   leave the prompt out of a non-streamed answer

and answers ``text_output`` (BYTES). Clients send tensor data either in the tensor's typed
``contents`` or, one entry per input in input order, in ``raw_input_contents``; a BYTES tensor
in raw form is a run of elements, each a 4-byte little-endian length and that many bytes, and a
BOOL tensor one byte per element. Anything malformed raises ``InvalidRequest`` naming the input.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from gateway_server.errors import InvalidRequest
from hangup_contract.protos import inference_pb2 as pb

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
_EXPECTED = {
    TEXT_INPUT: "BYTES",
    "stream": "BOOL",
    "sampling_parameters": "BYTES",
    "exclude_input_in_output": "BOOL",
}
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class TextRequest:
    prompt: str
    stream: bool
    sampling: dict[str, Any]
    exclude_input_in_output: bool


def decode_bytes_tensor(raw: bytes, name: str) -> list[bytes]:
    """The elements of a raw BYTES tensor. Raises InvalidRequest when the framing is cut."""
    elements = []
    offset = 0
    while offset < len(raw):
        if offset + _LENGTH.size > len(raw):
            raise InvalidRequest(f"input {name!r}: truncated BYTES element length", param=name)
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + length > len(raw):
            raise InvalidRequest(f"input {name!r}: BYTES element longer than the data", param=name)
        elements.append(raw[offset : offset + length])
        offset += length
    return elements


def encode_bytes_tensor(elements: list[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(e)) + e for e in elements)


def _elements(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None
) -> list[bytes] | list[bool]:
    name = tensor.name
    if raw is not None:
        if tensor.datatype == "BYTES":
            return decode_bytes_tensor(raw, name)
        return [b != 0 for b in raw]
    if tensor.datatype == "BYTES":
        return list(tensor.contents.bytes_contents)
    return list(tensor.contents.bool_contents)


def _single(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Any:
    name = tensor.name
    expected = _EXPECTED.get(name)
    if expected is None:
        known = ", ".join(_EXPECTED)
        raise InvalidRequest(f"unknown input {name!r}; the model takes {known}", param=name)
    if tensor.datatype != expected:
        raise InvalidRequest(
            f"input {name!r} must be {expected}, not {tensor.datatype or 'unset'}", param=name
        )
    values = _elements(tensor, raw)
    if len(values) != 1:
        raise InvalidRequest(f"input {name!r} must hold one element, not {len(values)}", param=name)
    return values[0]


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input {name!r} is not valid UTF-8", param=name) from exc


def _sampling(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(_text(raw, "sampling_parameters"))
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"'sampling_parameters' is not valid JSON: {exc}", param="sampling_parameters"
        ) from exc
    if not isinstance(value, dict):
        raise InvalidRequest(
            "'sampling_parameters' must be a JSON object", param="sampling_parameters"
        )
    return value


def decode_request(request: pb.ModelInferRequest) -> TextRequest:
    """The text request carried by ``request``'s input tensors. Raises InvalidRequest."""
    raw_contents = list(request.raw_input_contents)
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InvalidRequest(
            f"{len(raw_contents)} raw_input_contents for {len(request.inputs)} inputs"
        )
    values: dict[str, Any] = {}
    for index, tensor in enumerate(request.inputs):
        if tensor.name in values:
            raise InvalidRequest(f"input {tensor.name!r} is given twice", param=tensor.name)
        values[tensor.name] = _single(tensor, raw_contents[index] if raw_contents else None)
    for output in request.outputs:
        if output.name != TEXT_OUTPUT:
            raise InvalidRequest(f"unknown output {output.name!r}; the model has {TEXT_OUTPUT!r}")
    if TEXT_INPUT not in values:
        raise InvalidRequest(f"input {TEXT_INPUT!r} (BYTES) is required", param=TEXT_INPUT)
    return TextRequest(
        prompt=_text(values[TEXT_INPUT], TEXT_INPUT),
        stream=bool(values.get("stream", False)),
        sampling=_sampling(values.get("sampling_parameters")),
        exclude_input_in_output=bool(values.get("exclude_input_in_output", False)),
    )


def parameter(request: pb.ModelInferRequest, name: str) -> bool | int | str | float | None:
    """A request parameter's value, whichever of the oneof fields holds it; None when absent."""
    if name not in request.parameters:
        return None
    value = request.parameters[name]
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


def text_response(
    model: str, version: str, request_id: str, text: str | None, parameters: dict[str, Any]
) -> pb.ModelInferResponse:
    """A response carrying ``text`` as ``text_output`` (no outputs when ``text`` is None)."""
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    for key, value in parameters.items():
        _set_parameter(response.parameters[key], value)
    if text is not None:
        response.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1])
        response.raw_output_contents.append(encode_bytes_tensor([text.encode("utf-8")]))
    return response


def _set_parameter(target: pb.InferParameter, value: bool | int | str) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    else:
        target.string_param = value
