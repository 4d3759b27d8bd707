"""KServe v2 ``/infer`` over HTTP, read and written as Triton's HTTP frontend does, as KServe v2
gRPC messages (no I/O).

A request is a JSON object (``id``, ``parameters``, ``inputs``, ``outputs``), followed by the
binary tensor extension's data when ``Inference-Header-Content-Length`` says where the JSON ends:
an input with ``parameters.binary_data_size`` takes that many bytes of it, in input order; any
other input gives its elements in ``data`` (nested arrays are read row-major). Every input goes up
as raw bytes (``raw_input_contents``). Each field is checked as it is used, before what depends on
it, in Triton's words where Triton refuses it (:mod:`.tensors`): the framing, each input's name
against the model's, its shape, then its data; binary data must fill its inputs exactly. An
output asked for with ``parameters.binary_data`` (or every output, with the request parameter
``binary_data_output``) comes back as binary data after the JSON, the answer then
``application/octet-stream`` with its own ``Inference-Header-Content-Length``; others as
``data``. Numbers are written as Triton writes them where Python's shortest form is rapidjson's
(its exponent form: ``1e-7``, ``1e21``); a float whose shortest form has fewer digits than
rapidjson prints is the same value in fewer digits.
The JSON is read and written by msgspec, in C (the body as ``json.loads`` reads it: see
:func:`.codec.parse_body`; a tensor's data in one call where msgspec's layout is rapidjson's).
"""

from __future__ import annotations

from typing import Any

from hangup_contract.protos import inference_pb2 as pb
from proxy.triton.codec import (
    SURROGATE,
    GenerateError,
    ModelInputs,
    elements,
    encode,
    parse_body,
    set_parameters,
)
from proxy.triton.tensors import binary_size, member, not_a, packed, shape_of

HEADER_LENGTH = "Inference-Header-Content-Length"
_HTTP_ONLY = ("binary_data", "binary_data_size", "binary_data_output")


def infer_request(
    model: ModelInputs, raw: bytes, header_length: str | None
) -> tuple[pb.ModelInferRequest, set[str], bool]:
    """The gRPC request for ``model``, the outputs asked for as binary data, and whether every
    output is. Raises ``GenerateError`` (400) for anything Triton would refuse to read: the
    framing first (where the JSON ends), then each field as it is used, an input or output the
    model does not have before the next is read; binary data must fill its inputs exactly, as
    Triton checks it."""
    split = len(raw) if header_length is None else _split(header_length, len(raw))
    body, binary = parse_body(raw[:split]), memoryview(raw)[split:]
    try:
        return _request(model, body, binary)
    except UnicodeEncodeError as exc:  # a lone surrogate, which json reads and protobuf cannot
        raise GenerateError(400, SURROGATE) from exc


def _split(header_length: str, size: int) -> int:
    digits = header_length.removeprefix("-")
    if not (digits.isascii() and digits.isdigit() and len(digits) < 20):
        raise GenerateError(400, f"{HEADER_LENGTH} is not a number: {header_length[:40]!r}")
    split = int(header_length)
    if not 0 <= split <= size:
        raise GenerateError(
            400, f"inference header size should be in range (0, {size}), got: {split}"
        )
    return split


def _request(
    model: ModelInputs, body: dict[str, Any], binary: memoryview
) -> tuple[pb.ModelInferRequest, set[str], bool]:
    request = pb.ModelInferRequest(model_name=model.name, model_version=model.version)
    if "id" in body:
        request.id = member(body, "id", str)
    parameters = _object(body.get("parameters", {}), "parameters")
    all_binary = _flag(parameters.pop("binary_data_output", False), "binary_data_output")
    set_parameters(request.parameters, parameters)
    if "inputs" not in body:
        member(body, "inputs", list)  # refused in Triton's words
    at, names = 0, set[str]()
    for entry in _list(body["inputs"], "inputs"):
        at = _input(request, _object(entry, "an input"), binary, at, model, names)
    if at != len(binary):
        raise GenerateError(400, f"unexpected additional input data for model '{model.name}'")
    binary_outputs: set[str] = set()
    asked: set[str] = set()
    for entry in _list(body.get("outputs", []), "outputs"):
        output = _object(entry, "an output")
        name = member(output, "name", str)
        if name not in model.outputs:
            raise GenerateError(
                400, f"unexpected inference output '{name}' for model '{model.name}'"
            )
        extra = _object(output.get("parameters", {}), "the parameters of an output")
        if _flag(extra.get("binary_data", False), "binary_data"):
            binary_outputs.add(name)
        if name in asked:  # Triton takes an output asked for twice once
            continue
        asked.add(name)
        added_output = request.outputs.add(name=name)
        set_parameters(added_output.parameters,
                       {k: v for k, v in extra.items() if k not in _HTTP_ONLY})  # fmt: skip
    return request, binary_outputs, all_binary


def _input(
    request: pb.ModelInferRequest,
    tensor: dict[str, Any],
    binary: memoryview,
    at: int,
    model: ModelInputs,
    names: set[str],
) -> int:
    """One input added to ``request`` (its name added to ``names``, the inputs' so far), its
    data from ``binary`` at ``at`` or its JSON ``data``; returns where the next input's binary
    data starts."""
    name = member(tensor, "name", str)
    if name not in model.datatypes:
        raise GenerateError(400, f"unexpected inference input '{name}' for model '{model.name}'")
    if name in names:
        said = f"[request id: {request.id or '<id_unknown>'}]"
        raise GenerateError(400, f"{said} input '{name}' already exists in request")
    names.add(name)
    datatype, shape = member(tensor, "datatype", str), shape_of(tensor)
    extra = _object(tensor.get("parameters", {}), f"the parameters of input '{name}'")
    plain = "data" in tensor and not extra  # the usual input: JSON data, no parameters
    size = None if plain else binary_size(name, extra, "data" in tensor)
    if size is None:
        data = packed(name, datatype, shape, tensor["data"])
    elif at + size > len(binary):
        missing = at + size - len(binary)
        raise GenerateError(
            400,
            f"unexpected size for input '{name}', expecting {missing} additional bytes "
            f"for model '{model.name}'",
        )
    else:
        data, at = bytes(binary[at : at + size]), at + size
    added = request.inputs.add(name=name, datatype=datatype, shape=shape)
    set_parameters(added.parameters, {k: v for k, v in extra.items() if k not in _HTTP_ONLY})
    request.raw_input_contents.append(data)
    return at


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


def _flag(value: object, key: str) -> bool:
    if type(value) is not bool:
        raise GenerateError(400, not_a(key, bool))
    return value


def _value(parameter: pb.InferParameter) -> object:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None
