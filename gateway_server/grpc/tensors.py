"""KServe v2 tensors in and out of protobuf messages, for the text-generation model. No I/O.

The model takes what Triton's vLLM backend takes, each a one-element tensor of shape ``[1]``:

    text_input               BYTES  the prompt (UTF-8)                          required
    stream                   BOOL   one response per chunk instead of one at the end
    sampling_parameters      BYTES  a JSON object (max_tokens, temperature, …)
    exclude_input_in_output  BOOL   leave the prompt out of a non-streamed answer

and answers ``text_output`` (BYTES). Clients send tensor data either in the tensor's typed
``contents`` or, one entry per input in input order, in ``raw_input_contents``; a BYTES tensor
in raw form is a run of elements, each a 4-byte little-endian length and that many bytes, and a
BOOL tensor one byte per element.

A message may be as large as the gRPC receive limit, so nothing here builds a list of a client's
elements: each input is held to its framing first (its shape, its datatype, the count of typed
elements, the raw byte length), and of a raw BYTES tensor only the first element and the start
of a second are read. Work is constant per input beyond protobuf's own parse, which is linear.
Anything malformed raises ``InvalidRequest`` in Triton's words for the same fault (a client's
strings quoted at most :data:`SHOWN` characters long).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from gateway_server.errors import InvalidRequest
from gateway_server.requests import json_object
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
SHOWN = 64
"""The most characters of a client's string (a name, an id) an error message quotes."""
_SHOWN_DIMS = 8


@dataclass(frozen=True, slots=True)
class TextRequest:
    prompt: str
    stream: bool
    sampling: dict[str, Any]
    exclude_input_in_output: bool


def shown(value: str) -> str:
    """``value`` quoted for an error message: whole up to :data:`SHOWN` characters, else cut."""
    if len(value) <= SHOWN:
        return repr(value)
    return f"{value[:SHOWN]!r}... ({len(value)} characters)"


def decode_bytes_tensor(raw: bytes, name: str) -> list[bytes]:
    """The elements of a raw BYTES tensor. Raises InvalidRequest when the framing is cut.

    For tensors the gateway writes or reads back (a response's ``text_output``); a request's
    inputs are read by :func:`decode_request`, which never lists a client's elements."""
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


@dataclass(frozen=True, slots=True)
class _Input:
    """One input as error messages name it."""

    name: str
    model: str

    def refuse(self, message: str) -> InvalidRequest:
        return InvalidRequest(message, param=self.name)

    @property
    def inference_input(self) -> str:
        return f"inference input {shown(self.name)} for model {shown(self.model)}"


def _check_shape(tensor: pb.ModelInferRequest.InferInputTensor, where: _Input) -> None:
    """Every input of the model has shape ``[1]`` (Triton checks a request against the model's
    ``dims: [1]`` the same way, with these words)."""
    shape = tensor.shape
    if len(shape) == 1 and shape[0] == 1:
        return
    first = shape[:_SHOWN_DIMS]  # never more: a shape may have a million dimensions
    dims = ",".join(str(d) for d in first) + ("..." if len(shape) > _SHOWN_DIMS else "")
    name, model = shown(where.name), shown(where.model)
    if any(d < 0 for d in first):
        raise where.refuse(
            f"All input dimensions should be specified for input {name} for model {model}, "
            f"got [{dims}]"
        )
    raise where.refuse(
        f"unexpected shape for input {name} for model {model}. Expected [1], got [{dims}]."
    )


def _first_raw_element(raw: bytes, where: _Input) -> tuple[bytes, int]:
    """The first element of a raw BYTES tensor and how many there are: 0, 1, or 2 for more
    than one (the second is not read past its length). Raises InvalidRequest for a cut
    framing."""
    if not raw:
        return b"", 0
    size = _LENGTH.size
    if len(raw) < size:
        raise _incomplete_length(len(raw), where)
    (length,) = _LENGTH.unpack_from(raw)
    end = size + length
    if end > len(raw):
        raise where.refuse(
            f"incomplete string data for inference input {shown(where.name)}, expecting string "
            f"of length {length} but only {len(raw) - size} bytes available"
        )
    if end == len(raw):
        return raw[size:end], 1
    if len(raw) - end < size:
        raise _incomplete_length(len(raw) - end, where)
    return b"", 2


def _incomplete_length(available: int, where: _Input) -> InvalidRequest:
    return where.refuse(
        f"incomplete string length indicator for {where.inference_input}, expecting 4 bytes but "
        f"only {available} bytes available. Please make sure the string length indicator is in "
        "one buffer."
    )


def _one_bytes(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, where: _Input
) -> bytes:
    if raw is None:
        typed = tensor.contents.bytes_contents
        first, count = (typed[0] if typed else b""), min(len(typed), 2)
    else:
        first, count = _first_raw_element(raw, where)
    if count == 1:
        return first
    if count == 0:
        raise where.refuse(f"expected 1 string elements for {where.inference_input}, got 0")
    raise where.refuse(
        f"unexpected number of string elements 2 for {where.inference_input}, expecting 1"
    )


def _one_bool(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, where: _Input
) -> bool:
    typed = tensor.contents.bool_contents
    size = len(typed) if raw is None else len(raw)
    if size != 1:
        raise where.refuse(
            f"input byte size mismatch for input {shown(where.name)} for model "
            f"{shown(where.model)}. Expected 1, got {size}"
        )
    return bool(typed[0]) if raw is None else raw[0] != 0


def _single(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, model: str
) -> bytes | bool:
    where = _Input(tensor.name, model)
    expected = _EXPECTED.get(where.name)
    if expected is None:
        known = ", ".join(_EXPECTED)
        raise where.refuse(f"unknown input {shown(where.name)}; the model takes {known}")
    if tensor.datatype != expected:
        raise where.refuse(
            f"input {where.name!r} must be {expected}, not {tensor.datatype[:SHOWN] or 'unset'}"
        )
    _check_shape(tensor, where)
    if raw is not None and tensor.HasField("contents"):
        raise where.refuse(
            f"contents field must not be specified when using raw_input_contents for "
            f"{shown(where.name)} for model {shown(model)}"
        )
    if expected == "BYTES":
        return _one_bytes(tensor, raw, where)
    return _one_bool(tensor, raw, where)


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input {name!r} is not valid UTF-8", param=name) from exc


def _sampling(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    name = "sampling_parameters"
    return json_object(_text(raw, name), f"{name!r}", param=name)


def decode_request(request: pb.ModelInferRequest) -> TextRequest:
    """The text request carried by ``request``'s input tensors. Raises InvalidRequest.

    Constant work per input past protobuf's parse (see the module): a raw tensor is copied out
    of the message once, and nothing else grows with what the client sent."""
    inputs, raw_contents = request.inputs, request.raw_input_contents
    if raw_contents and len(raw_contents) != len(inputs):
        raise InvalidRequest(f"{len(raw_contents)} raw_input_contents for {len(inputs)} inputs")
    model = request.model_name
    values: dict[str, Any] = {}
    for index, tensor in enumerate(inputs):  # at most one more than the model's four inputs
        if tensor.name in values:
            raise InvalidRequest(f"input {tensor.name!r} is given twice", param=tensor.name)
        values[tensor.name] = _single(tensor, raw_contents[index] if raw_contents else None, model)
    outputs = request.outputs
    if len(outputs) > 1:
        raise InvalidRequest(
            f"{len(outputs)} outputs requested; the model has one, {TEXT_OUTPUT!r}"
        )
    if outputs and outputs[0].name != TEXT_OUTPUT:
        raise InvalidRequest(
            f"unknown output {shown(outputs[0].name)}; the model has {TEXT_OUTPUT!r}"
        )
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
