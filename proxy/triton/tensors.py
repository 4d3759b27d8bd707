"""One input tensor of ``/infer``, read as Triton's HTTP frontend reads it (no I/O): each field
checked before it is used, refused with a 400 in Triton's words where Triton refuses it, and the
data packed as the raw little-endian bytes gRPC carries (``raw_input_contents``).

Work is linear in the body, whatever it holds: a shape's element count is multiplied only while
it stays within what the body could carry (``most``), so a shape of many dimensions is refused
before its product grows, never multiplied out (a product of 100,000 dimensions is a number of
100,000 digits, each step slower than the last); nested data is flattened in one pass over its
arrays (recursion would build every leaf's list again at every level, and stop at Python's
recursion limit); the checks over every element are C loops (``set(map(type, values))``), and
BYTES elements are encoded and prefixed in C loops too.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import struct
import sys
from typing import Any

from proxy.triton.codec import STRUCT_CODES, TOO_BIG, GenerateError

# Triton's words for what it refuses (its HTTP frontend's, 2.51), with the proxy's 400
SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_ONE_OF = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But "
)
_KINDS = {str: "string", int: "unsigned-integer", list: "array", bool: "boolean"}
_INT64 = 1 << 63  # a shape's dimensions are int64 on gRPC
_U32 = struct.Struct("<I").pack
_HALF = ("FP16", "BF16")  # Triton takes them only as binary data
_PASSES = 8  # levels of nested data opened a pass each (a tensor's rank, usually far fewer)


def member(obj: dict[str, Any], key: str, kind: type) -> Any:
    """``obj[key]``, which must be there and of ``kind`` (a JSON ``true`` is no integer)."""
    if key not in obj:
        raise GenerateError(
            400, f"Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        )
    value = obj[key]
    if type(value) is not kind or (type(value) is int and value < 0):
        raise GenerateError(400, not_a(key, kind))
    return value


def not_a(key: str, kind: type) -> str:
    name = _KINDS[kind]
    return f"Unable to parse '{key}': attempt to access JSON non-{name} as {name}"


def shape_of(tensor: dict[str, Any]) -> list[int]:
    """The tensor's ``shape``: dimensions that are JSON integers from 0 to 2**63 - 1 (looked at
    one by one where there are a few, in C loops where there are many)."""
    shape: list[int] = member(tensor, "shape", list)
    if len(shape) > 8:
        if not set(map(type, shape)) <= {int} or min(shape) < 0:
            raise GenerateError(400, not_a("shape", int))
        if max(shape) >= _INT64:
            raise GenerateError(400, f"Unable to parse 'shape': {max(shape)} is beyond int64")
        return shape
    for dimension in shape:
        if type(dimension) is not int or dimension < 0:
            raise GenerateError(400, not_a("shape", int))
        if dimension >= _INT64:
            raise GenerateError(400, f"Unable to parse 'shape': {dimension} is beyond int64")
    return shape


def element_count(shape: list[int], most: int) -> int | None:
    """The number of elements ``shape`` holds, or None once it is more than ``most``: never a
    product past ``most`` times one dimension (each step's numbers stay machine-sized)."""
    if 0 in shape:
        return 0
    count = 1
    for dimension in shape:
        count *= dimension
        if count > most:
            return None
    return count


def binary_size(name: str, parameters: dict[str, Any], has_data: bool) -> int | None:
    """``binary_data_size`` of an input's parameters, if given (a JSON integer, at least 0);
    refused with Triton's words alongside ``data``, or where neither is given (shared memory,
    Triton's third way, is not carried by the bridge)."""
    if "binary_data_size" not in parameters:
        if has_data:
            return None
        if "shared_memory_region" in parameters:
            raise GenerateError(400, f"input '{name}' has neither 'data' nor binary_data_size")
        raise GenerateError(400, _ONE_OF + "no field is set")
    if has_data:
        raise GenerateError(400, _ONE_OF + "set 'data' 'binary_data_size'")
    size = parameters["binary_data_size"]
    if type(size) is not int or size < 0:
        raise GenerateError(400, not_a("binary_data_size", int))
    return int(size)


def packed(name: str, datatype: str, shape: list[int], data: object) -> bytes:
    """An input's JSON ``data`` as raw bytes. The usual shape, flat numbers of the right count,
    is packed in one struct call: struct refuses a list as a number (BOOL's "?" takes any
    object, so it is left out, as are FP16 and BF16, which Triton refuses as JSON), so what
    does not pack (nested, or a bad value) is read the checked way, which says why."""
    code = STRUCT_CODES.get(datatype)
    if code not in (None, "?", "e") and isinstance(data, list):
        count = len(data)
        if shape == [count] or element_count(shape, count) == count:
            with contextlib.suppress(struct.error, OverflowError):
                return struct.pack(f"<{count}{code}", *data)
    return checked(name, datatype, shape, data)


def checked(name: str, datatype: str, shape: list[int], data: object) -> bytes:
    """``data`` as raw bytes, every refusal named: the datatype, the count against the shape,
    then each element's type and range."""
    if datatype in _HALF:
        raise GenerateError(
            400,
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}",
        )
    code = STRUCT_CODES.get(datatype)
    if code is None and datatype != "BYTES":
        raise GenerateError(400, f"invalid datatype for input {name}")
    values = flat(data)
    if element_count(shape, len(values)) != len(values):
        raise GenerateError(400, SHAPE_MISMATCH)
    kinds = set(map(type, values))
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise GenerateError(400, f"input '{name}' (BYTES) takes strings")
        return byte_strings(values)
    if datatype == "BOOL" and not kinds <= {bool}:
        raise GenerateError(400, f"input '{name}' (BOOL) takes booleans")
    assert code is not None
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except struct.error as exc:
        raise GenerateError(400, f"input '{name}' ({datatype}): {exc}") from exc
    except OverflowError:
        return _beyond_float(name, datatype, values)


def _beyond_float(name: str, datatype: str, values: list[Any]) -> bytes:
    """FP32 data beyond a float's range is infinity, as Triton casts it; a number beyond a
    double's range is refused in Triton's words."""
    if datatype != "FP32":
        raise GenerateError(400, TOO_BIG)
    try:
        floats = array.array("f", values)
    except OverflowError as exc:
        raise GenerateError(400, TOO_BIG) from exc
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tobytes()


def flat(value: object) -> list[Any]:
    """Nested arrays' leaves, row-major, in passes that are C loops or close to them: a flat
    list (the usual shape) is returned as it is; each pass opens one level of arrays (joined in
    one call where the level holds only arrays, spliced where it mixes arrays and leaves); past
    ``_PASSES`` levels what is left is walked once (:func:`_ragged`), so each array and each
    leaf is looked at a bounded number of times, however deep."""
    if type(value) is not list:
        return [value]
    level = value
    for _ in range(_PASSES):
        kinds = set(map(type, level))
        if list not in kinds:
            return level
        only_arrays = len(kinds) == 1
        level = list(itertools.chain.from_iterable(level)) if only_arrays else _spliced(level)
    return _ragged(level)


def _spliced(level: list[Any]) -> list[Any]:
    """One level of ``level`` opened: its arrays' items in their place."""
    opened: list[Any] = []
    append, extend = opened.append, opened.extend
    for item in level:
        if type(item) is list:
            extend(item)
        else:
            append(item)
    return opened


def _ragged(value: list[Any]) -> list[Any]:
    leaves: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if type(item) is not list:
                leaves.append(item)
            elif list not in map(type, item):
                leaves.extend(item)
            else:
                stack.append(iter(item))
                break
        else:
            stack.pop()
    return leaves


def byte_strings(values: list[str]) -> bytes:
    """BYTES elements as Triton's raw form: each a little-endian 4-byte length, then its UTF-8
    bytes (a lone surrogate raises ``UnicodeEncodeError``, for the caller to refuse)."""
    encoded = list(map(str.encode, values))
    parts: list[bytes] = [b""] * (2 * len(encoded))
    parts[::2] = map(_U32, map(len, encoded))
    parts[1::2] = encoded
    return b"".join(parts)
