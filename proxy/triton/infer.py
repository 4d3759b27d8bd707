"""KServe v2 ``/infer`` over HTTP, read and written as Triton's HTTP frontend does, as KServe v2
gRPC messages (no I/O).

A request is a JSON object (``id``, ``parameters``, ``inputs``, ``outputs``), followed by the
binary tensor extension's data when ``Inference-Header-Content-Length`` says where the JSON ends:
an input with ``parameters.binary_data_size`` takes that many bytes of it, in input order; any
other input gives its elements in ``data`` (nested arrays are read row-major). Every input goes up
as raw bytes (``raw_input_contents``). An output asked for with ``parameters.binary_data`` (or
every output, with the request parameter ``binary_data_output``) comes back as binary data after
the JSON, the answer then ``application/octet-stream`` with its own
``Inference-Header-Content-Length``; others as ``data``. Numbers are written as Triton writes
them where Python's shortest form is rapidjson's (its exponent form: ``1e-7``, ``1e21``); a
float whose shortest form has fewer digits than rapidjson prints is the same value in fewer digits.
The JSON is read and written by msgspec, in C (the body as ``json.loads`` reads it: see
:func:`.codec.parse_body`; a tensor's data in one call where msgspec's layout is rapidjson's).
"""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

from hangup_contract.protos import inference_pb2 as pb
from proxy.triton.codec import (
    STRUCT_CODES,
    GenerateError,
    elements,
    encode,
    parse_body,
    set_parameters,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
_HTTP_ONLY = ("binary_data", "binary_data_size", "binary_data_output")


def infer_request(
    model: str, version: str, raw: bytes, header_length: str | None
) -> tuple[pb.ModelInferRequest, set[str], bool]:
    """The gRPC request, the outputs asked for as binary data, and whether every output is."""
    try:
        split = len(raw) if header_length is None else int(header_length)
    except ValueError as exc:
        raise GenerateError(400, f"{HEADER_LENGTH} is not a number: {header_length!r}") from exc
    if not 0 <= split <= len(raw):
        raise GenerateError(400, f"{HEADER_LENGTH} {split} is outside the body")
    body, binary = parse_body(raw[:split]), memoryview(raw)[split:]
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    if "id" in body:
        request.id = str(body["id"])
    parameters = _object(body.get("parameters", {}), "parameters")
    all_binary = bool(parameters.pop("binary_data_output", False))
    set_parameters(request.parameters, parameters)
    at = 0
    for entry in _list(body.get("inputs"), "inputs"):
        tensor = _object(entry, "an input")
        name, datatype = str(tensor.get("name")), str(tensor.get("datatype"))
        shape = [int(d) for d in _list(tensor.get("shape"), f"the shape of input '{name}'")]
        extra = _object(tensor.get("parameters", {}), f"the parameters of input '{name}'")
        size = extra.get("binary_data_size")
        if size is not None:
            data, at = bytes(binary[at : at + int(size)]), at + int(size)
        else:
            data = _raw(name, datatype, shape, tensor.get("data"))
        added = request.inputs.add(name=name, datatype=datatype, shape=shape)
        set_parameters(added.parameters, {k: v for k, v in extra.items() if k not in _HTTP_ONLY})
        request.raw_input_contents.append(data)
    binary_outputs: set[str] = set()
    for entry in _list(body.get("outputs", []), "outputs"):
        output = _object(entry, "an output")
        extra = _object(output.get("parameters", {}), "the parameters of an output")
        if extra.get("binary_data"):
            binary_outputs.add(str(output.get("name")))
        added_output = request.outputs.add(name=str(output.get("name")))
        set_parameters(added_output.parameters,
                       {k: v for k, v in extra.items() if k not in _HTTP_ONLY})  # fmt: skip
    return request, binary_outputs, all_binary


def infer_answer(
    response: pb.ModelInferResponse, binary_outputs: set[str], all_binary: bool
) -> tuple[bytes, dict[str, str]]:
    """The body Triton writes for ``response``, and its content headers."""
    head: dict[str, Any] = {}
    if response.id:
        head["id"] = response.id
    head |= {"model_name": response.model_name, "model_version": response.model_version}
    if response.parameters:
        head["parameters"] = {k: _value(v) for k, v in response.parameters.items()}
    outputs, tail = [], b""
    for i, output in enumerate(response.outputs):
        data = response.raw_output_contents[i] if i < len(response.raw_output_contents) else b""
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype,
                                 "shape": list(output.shape)}  # fmt: skip
        extra = {k: _value(v) for k, v in output.parameters.items()}
        if all_binary or output.name in binary_outputs:
            entry["parameters"] = extra | {"binary_data_size": len(data)}
            tail += data
        else:
            if extra:
                entry["parameters"] = extra
            entry["data"] = elements(output.datatype, data)
        outputs.append(entry)
    head["outputs"] = outputs
    text = encode(head)
    if not tail:
        return text, {"Content-Type": "application/json"}
    return text + tail, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise GenerateError(400, f"{what} must be a JSON object")
    return dict(value)


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise GenerateError(400, f"{what} must be a JSON array")
    return value


def _flat(value: object) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    if list not in map(type, value):  # JSON's arrays are lists: none is nested (looked at in C)
        return value  # flat already (the usual shape): read only, never changed
    return [leaf for item in value for leaf in _flat(item)]


def _raw(name: str, datatype: str, shape: list[int], data: object) -> bytes:
    code = STRUCT_CODES.get(datatype)
    if code not in (None, "?") and isinstance(data, list) and len(data) == math.prod(shape):
        # The usual shape, flat numbers of the right count, packed at once: struct refuses a
        # list as a number (BOOL's "?" takes any object, so it is left out), so what does not
        # pack (nested, or a bad value) is read the checked way below, which says why.
        with contextlib.suppress(struct.error):
            return struct.pack(f"<{len(data)}{code}", *data)
    return _checked_raw(name, datatype, shape, data)


def _checked_raw(name: str, datatype: str, shape: list[int], data: object) -> bytes:
    if data is None:
        raise GenerateError(400, f"input '{name}' has neither 'data' nor binary_data_size")
    values = _flat(data)
    if len(values) != math.prod(shape):
        raise GenerateError(400, f"input '{name}': {len(values)} values for shape {shape}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise GenerateError(400, f"input '{name}' (BYTES) takes strings")
        return b"".join(struct.pack("<I", len(e)) + e for e in (v.encode() for v in values))
    code = STRUCT_CODES.get(datatype)
    if code is None:
        raise GenerateError(400, f"input '{name}': {datatype} cannot be given as JSON data")
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except struct.error as exc:
        raise GenerateError(400, f"input '{name}' ({datatype}): {exc}") from exc


def _value(parameter: pb.InferParameter) -> object:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None
