"""The encoded ``ModelStreamInferResponse`` of a streamed text answer, built as bytes. No I/O.

A stream writes one response per token, and of each response only the text and the
``triton_final_response`` flag change within a request: model name, version, request id, the
other parameters and the output tensor's description are the request's. :class:`TextResponses`
encodes those once per request and each response by joining them with the flag and the text,
instead of building a message (and a wrapping message) per token and serializing it.

The bytes parse to the message :func:`gateway_server.grpc.tensors.text_response` builds, and they
are what protobuf's deterministic serialization writes, byte for byte: fields in field-number
order, map entries sorted by key (its plain ``SerializeToString`` writes a map in its hash
table's order, which changes from one process to the next: the same message either way).
``tests/pure/test_grpc_responses.py`` checks both.

The wire format (protobuf's encoding) in brief: a field is a tag
(``field_number << 3 | wire_type``) then its value; strings, bytes and messages are wire type 2,
a varint length and the bytes; an empty string is left out (proto3), except inside a ``oneof``
(``InferParameter``'s value), which is written even when it is the default.
"""

from __future__ import annotations

from typing import Any

from gateway_server.grpc.tensors import TEXT_OUTPUT

_LENGTH_DELIMITED = 2
_VARINT = 0


def varint(value: int) -> bytes:
    """``value`` (not negative) as a protobuf varint: 7 bits a byte, low bits first."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, _LENGTH_DELIMITED) + varint(len(payload)) + payload


def _string(number: int, value: str) -> bytes:
    """A proto3 string field: nothing when empty."""
    return _delimited(number, value.encode()) if value else b""


def _parameter(key: str, value: bool | int | str) -> bytes:
    """One entry of ``ModelInferResponse.parameters`` (field 4, map<string, InferParameter>)."""
    if isinstance(value, bool):
        choice = _tag(1, _VARINT) + (b"\x01" if value else b"\x00")  # bool_param
    elif isinstance(value, int):
        choice = _tag(2, _VARINT) + varint(value & 0xFFFFFFFFFFFFFFFF)  # int64_param
    else:
        choice = _delimited(3, value.encode())  # string_param
    return _delimited(4, _delimited(1, key.encode()) + _delimited(2, choice))


def _parameters(values: dict[str, bool | int | str]) -> bytes:
    """The map's entries in key order, as Python protobuf's (upb's) deterministic serialization
    orders them: by their UTF-8 bytes, a key that another key extends after that key (``ab``
    before ``a``: the ``\xff`` appended, a byte UTF-8 never holds, makes it so)."""
    ordered = sorted(values.items(), key=lambda item: item[0].encode() + b"\xff")
    return b"".join(_parameter(key, value) for key, value in ordered)


_TEXT_OUTPUT = _delimited(
    5, _delimited(1, TEXT_OUTPUT.encode()) + _delimited(2, b"BYTES") + _delimited(3, b"\x01")
)
"""``outputs``: one tensor ``text_output``, BYTES, shape ``[1]`` (packed int64)."""
_MOST_FRAMING = len(_TEXT_OUTPUT) + 1 + 10 + 4 + 1 + 10
"""Besides the head and the text: ``outputs``, the tag, length and element length of
``raw_output_contents``, the tag and length of ``infer_response`` (varints of 10 bytes at most)."""


class TextResponses:
    """The responses to one request: ``text_response(model, version, request_id, text,
    {flag: final, **extra})`` wrapped as a ``ModelStreamInferResponse``'s ``infer_response``,
    serialized, for any ``text`` (given as its UTF-8 bytes; None: no outputs) and ``final``.
    Immutable once built; compared by identity (one per request)."""

    __slots__ = ("_heads", "overhead")

    def __init__(
        self, model: str, version: str, request_id: str, flag: str, extra: dict[str, Any]
    ) -> None:
        head = _string(1, model) + _string(2, version) + _string(3, request_id)
        self._heads = (
            head + _parameters({**extra, flag: False}),
            head + _parameters({**extra, flag: True}),
        )
        self.overhead = len(self._heads[True]) + _MOST_FRAMING
        """A response's bytes besides its text's, at most."""

    def encode(self, data: bytes | None, final: bool) -> bytes:
        """The serialized ``ModelStreamInferResponse`` carrying the text ``data`` (UTF-8) with
        the flag ``final``."""
        body = self._heads[final]
        if data is not None:
            element = len(data).to_bytes(4, "little") + data
            body = body + _TEXT_OUTPUT + b"\x32" + varint(len(element)) + element
        return b"\x12" + varint(len(body)) + body  # infer_response, field 2
