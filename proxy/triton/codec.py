"""Triton's generate extension, read and written as Triton's HTTP frontend does, over KServe v2
gRPC messages (no I/O).

A ``generate`` body is a JSON object: each key naming an input of the model becomes that input
(a JSON scalar is one element, shape ``[1]``; a flat array is ``[n]`` elements), typed by the
model's metadata; ``parameters`` become the request's parameters; any other key is ignored, as
Triton ignores it. An answer is ``{"model_name", "model_version", <each output>}``, an output of
one element as a JSON scalar and of several as an array, written as Triton's rapidjson writer
writes it: compact, non-ASCII text as is, numbers in rapidjson's form (``1e-7``, not Python's
``1e-07``; :func:`encode`, which ``/infer``'s answers share).
"""

from __future__ import annotations

import gc
import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from hangup_contract.protos import inference_pb2 as pb

# datatype -> (the InferTensorContents field, the Python type a JSON value must be, struct code)
_NUMBERS: dict[str, tuple[str, type, str]] = {
    "INT8": ("int_contents", int, "b"), "INT16": ("int_contents", int, "h"),
    "INT32": ("int_contents", int, "i"), "INT64": ("int64_contents", int, "q"),
    "UINT8": ("uint_contents", int, "B"), "UINT16": ("uint_contents", int, "H"),
    "UINT32": ("uint_contents", int, "I"), "UINT64": ("uint64_contents", int, "Q"),
    "FP32": ("fp32_contents", float, "f"), "FP64": ("fp64_contents", float, "d"),
}  # fmt: skip


T = TypeVar("T")
_INT64 = 1 << 63
_SLICE = 1 << 16  # elements added to a repeated field in one call into C
MESSAGE_LIMIT = 1024  # characters of a refusal's message

# datatype -> struct code: how raw tensor data (little-endian, row-major) is packed, both ways
STRUCT_CODES = {"BOOL": "?", "FP16": "e"} | {name: code for name, (_, _, code) in _NUMBERS.items()}


class GenerateError(Exception):
    """A request Triton would refuse, answered before it goes up: its HTTP status and message
    (what it quotes of the request written so that it can be sent, a lone surrogate escaped, and
    cut at ``MESSAGE_LIMIT`` characters: an input named with 8 MiB is not echoed, nor logged)."""

    def __init__(self, status: int, message: str) -> None:
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 1] + "…"
        if not message.isascii():
            message = message.encode("utf-8", "backslashreplace").decode()
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ModelInputs:
    """What the bridge needs of a model: its inputs' types, its outputs' names, and whether it is
    decoupled (zero to many responses a request). Which inputs are missing is Triton's to say,
    in its words; an input or output the model does not have is refused before the rest of the
    request is read (a body of a million entries is no longer read entry by entry)."""

    name: str
    version: str
    datatypes: Mapping[str, str]  # input name -> KServe datatype
    decoupled: bool
    outputs: frozenset[str] = frozenset()


_READ = msgspec.json.Decoder().decode
_HARD_EXPONENT = re.compile(rb"[eE]\+?0*(?:[1-9][0-9]{2,}|[3-9][0-9]|2[3-9])")  # 1e23 and past
_SCANNED_FROM = 4096  # bytes of body from which it is looked at for them first
# Triton's words (its HTTP frontend's, rapidjson's) for what both refuse
SURROGATE = "failed to parse the request JSON buffer: The surrogate pair in string is invalid."
TOO_BIG = "failed to parse the request JSON buffer: Number too big to be stored in double."


def parse_body(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, read as ``json.loads`` reads it (the same value, or a refusal, a
    400 naming the problem in json's words; what json raises on is refused too: nesting past
    Python's recursion limit, an integer of more than 4,300 digits)."""
    if len(raw) >= _SCANNED_FROM and _HARD_EXPONENT.search(raw) is not None:
        # msgspec reads a float whose decimal exponent is large the slow way: 7-20 us each for
        # 1e290 or 8.98846567431158e307 (0.03 for 1.25), 1.3 s a MiB of them, in one call into C
        # that holds the GIL; json reads them in 0.15 us. A smaller body costs a few ms at most.
        body = _json_body(raw)
    else:
        try:
            body = _READ(raw) if raw else None
        except (ValueError, RecursionError):
            # msgspec (every error of which is a ValueError) refuses some bodies json reads (NaN
            # and Infinity, a number beyond a float's range, UTF-16 and UTF-32, a UTF-8 BOM,
            # lone surrogates) and words its refusals its own way: json reads those again.
            body = _json_body(raw)
    if not isinstance(body, dict):
        raise GenerateError(400, "the request body must be a JSON object")
    return body


def _json_body(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GenerateError(400, f"failed to parse the request JSON buffer: {exc}") from exc
    except RecursionError as exc:
        raise GenerateError(400, f"failed to parse the request JSON buffer: {NESTED}") from exc
    except ValueError as exc:  # an integer past int()'s digit limit: Triton's words
        raise GenerateError(400, TOO_BIG) from exc


NESTED = "nested too deeply"


def built(build: Callable[[], T]) -> T:
    """``build()`` (a body parsed and made a request) with the cyclic garbage collector paused:
    a JSON body of many small arrays is millions of containers, and collections triggered while
    they are made scan them again and again (a body of 8 MiB of ``[1],`` took 750 ms with the
    collector running, 130 ms without). The body's objects are freed by their reference counts
    when ``build`` returns, so the collector never has to look at them."""
    if not gc.isenabled():
        return build()
    gc.disable()
    try:
        return build()
    finally:
        gc.enable()


def generate_request(model: ModelInputs, body: Mapping[str, Any]) -> pb.ModelInferRequest:
    """The KServe request Triton's generate extension makes of ``body``; raises ``GenerateError``
    (400) for a value the model's input cannot take."""
    request = pb.ModelInferRequest(model_name=model.name, model_version=model.version)
    try:
        for key, value in body.items():
            if key == "parameters":
                _parameters(request, value)
            elif key in model.datatypes:
                _input(request, key, model.datatypes[key], value)
    except UnicodeEncodeError as exc:  # a lone surrogate, which json reads and protobuf cannot
        raise GenerateError(400, SURROGATE) from exc
    return request


def _parameters(request: pb.ModelInferRequest, values: object) -> None:
    if not isinstance(values, dict):
        raise GenerateError(400, "'parameters' must be a JSON object")
    set_parameters(request.parameters, values)


def set_parameters(into: Any, values: Mapping[str, object]) -> None:
    """``values`` into a map of ``InferParameter`` (a request's, a tensor's). An integer beyond
    int64 is a double, as rapidjson reads it (Triton takes no uint64 parameter over gRPC)."""
    for key, value in values.items():
        parameter = into[key]
        kind = type(value)
        if kind is bool:
            parameter.bool_param = value
        elif kind is int and -_INT64 <= value < _INT64:  # type: ignore[operator]
            parameter.int64_param = value
        elif kind is int or kind is float:
            parameter.double_param = _double(value)
        elif kind is str:
            parameter.string_param = value
        else:
            raise GenerateError(400, f"parameter '{key}' must be a string, number or boolean")


def _double(value: Any) -> float:
    try:
        return float(value)
    except OverflowError as exc:  # an integer beyond a double's range
        raise GenerateError(400, TOO_BIG) from exc


def _input(request: pb.ModelInferRequest, name: str, datatype: str, value: object) -> None:
    values = value if type(value) is list else [value]
    kinds = set(map(type, values))  # one C loop over the elements (a Python one is 10x slower)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=[len(values)])
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise GenerateError(400, f"input '{name}' (BYTES) takes strings")
        tensor.contents.bytes_contents.extend(map(str.encode, values))
    elif datatype == "BOOL":
        if not kinds <= {bool}:
            raise GenerateError(400, f"input '{name}' (BOOL) takes booleans")
        tensor.contents.bool_contents.extend(values)  # type: ignore[arg-type]
    elif datatype in _NUMBERS:
        field, kind, _ = _NUMBERS[datatype]
        if not kinds <= ({int} if kind is int else {int, float}):
            raise GenerateError(400, f"input '{name}' ({datatype}) takes numbers of that type")
        try:
            _extend(getattr(tensor.contents, field), values)
        except OverflowError as exc:  # an integer beyond a double's range, as a float
            raise GenerateError(400, TOO_BIG) from exc
        except ValueError as exc:  # an integer beyond the field's range
            raise GenerateError(400, f"input '{name}' ({datatype}): {exc}") from exc
    else:
        raise GenerateError(400, f"input '{name}' is {datatype}, which generate cannot carry")


def _extend(field: Any, values: list[Any]) -> None:
    """``values`` onto a repeated field, a slice at a time: protobuf's extend is one call into C
    that holds the GIL throughout (360 ms for 4 million floats), and a large body is read in a
    worker thread (``bridge``) so that the event loop can run between two slices."""
    if len(values) <= _SLICE:
        field.extend(values)
        return
    for at in range(0, len(values), _SLICE):
        field.extend(values[at : at + _SLICE])


def answer(response: pb.ModelInferResponse, *, outputs_first: bool = False) -> dict[str, Any]:
    """The JSON object Triton's generate writes for one response: the model's name and version,
    then the outputs; the outputs first for a model that is not decoupled (as Triton writes
    them, on ``generate`` and ``generate_stream`` alike)."""
    names = {"model_name": response.model_name, "model_version": response.model_version}
    outputs: dict[str, Any] = {}
    raw = response.raw_output_contents
    for i, output in enumerate(response.outputs):
        values = elements(output.datatype, raw[i]) if i < len(raw) else _contents(output)
        outputs[output.name] = values[0] if len(values) == 1 else values
    return outputs | names if outputs_first else names | outputs


_ENCODE = msgspec.json.Encoder().encode


def number_text(value: float) -> str:
    """A float as rapidjson writes it: from Python's shortest digits, laid out by rapidjson's
    rules (a whole number up to 21 digits with ``.0``, down to 1e-6 as a decimal, else
    ``1.5e-7``)."""
    if not math.isfinite(value):
        return json.dumps(value)
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    power = int(exponent)
    sign, digits = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
    digits = digits.replace(".", "")
    if 0 <= power <= 20:
        return f"{sign}{digits.ljust(power + 1, '0')}.0"
    if -6 <= power < 0:
        return f"{sign}0.{'0' * (-power - 1)}{digits}"
    return f"{mantissa}e{power}"


def _rapidjson(value: object) -> object:
    """``value`` made ready for msgspec to write as rapidjson writes it: a tensor's data (a list
    of scalars) written by msgspec in one call where it holds no float or its text shows no
    exponent and no ``null`` (a number without an exponent is laid out as rapidjson lays it out,
    and msgspec escapes a string as json does; ``null`` is how msgspec writes NaN and infinity),
    else element by element, each float by :func:`number_text`."""
    if isinstance(value, dict):
        return {k: _rapidjson(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and not isinstance(value[0], (dict, list)):
            whole = _ENCODE(value)
            if (b"e" not in whole and b"null" not in whole) or not any(
                type(v) is float for v in value
            ):
                return msgspec.Raw(whole)
        return [_rapidjson(v) for v in value]
    if isinstance(value, float):
        return msgspec.Raw(number_text(value).encode())
    return value


def encode(body: object) -> bytes:
    """``body`` as Triton's HTTP frontend writes JSON (compact, non-ASCII text as is, numbers
    as rapidjson writes them)."""
    return _ENCODE(_rapidjson(body))


def elements(datatype: str, data: bytes) -> list[Any]:
    """A tensor's raw data (``raw_output_contents``) as JSON values, flat."""
    if datatype == "BYTES":
        values, at = [], 0
        while at + 4 <= len(data):
            (size,) = struct.unpack_from("<I", data, at)
            values.append(data[at + 4 : at + 4 + size].decode(errors="replace"))
            at += 4 + size
        return values
    code = STRUCT_CODES.get(datatype)
    if code is None:
        raise GenerateError(500, f"an output of datatype {datatype} cannot be written as JSON")
    return list(struct.unpack(f"<{len(data) // struct.calcsize(code)}{code}", data))


def _contents(output: pb.ModelInferResponse.InferOutputTensor) -> list[Any]:
    contents = output.contents
    if output.datatype == "BYTES":
        return [v.decode(errors="replace") for v in contents.bytes_contents]
    if output.datatype == "BOOL":
        return list(contents.bool_contents)
    field = _NUMBERS.get(output.datatype, ("", int, ""))[0]
    return list(getattr(contents, field)) if field else []
