"""The sibling channel's messages as bytes, with no I/O: lines in, messages out, and back.

A message is one line: a JSON object and ``\\n``. A *question* carries ``"n"``, a sequence
number (an integer) that its answer repeats, and ``"op"``, what is asked; a *notice* carries an
``"op"`` and no ``"n"`` and is never answered; an *answer* carries the question's ``"n"``.
Everything else is each side's vocabulary (:mod:`hangup_contract.runtime.siblings`).

Bounds (:class:`Bounds`): a line is at most so many bytes, a question's line far fewer than an
answer's (the socket's listener reads questions; an answer comes from the sibling that was
asked), and nesting is at most as deep as Python's JSON reader goes (about 1,000 levels, the
interpreter's recursion limit): deeper is malformed. :class:`Lines` cuts bytes into lines, each
byte looked at once, and hands a line past its bound over as ``None`` (skipped to its end: it
never holds more than the bound of it); :func:`decode` reads one line or raises
:class:`Malformed`; :func:`encode` refuses to write a line past its bound
(:class:`MessageTooLarge`), so what one side writes the other always reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a line may hold, in bytes (its newline not counted), and what may wait unsent."""

    question: int = 64 * 1024
    """A question's or a notice's line (every id in one is held to the id rule first)."""
    answer: int = 64 * 1024 * 1024
    """An answer's line (a busy process's ``/v2/requests`` part is one)."""
    unsent: int = 1024 * 1024
    """Questions written but not yet read by their sibling: past it a question fails at once
    (the sibling is not reading: stalled)."""


BOUNDS = Bounds()


class Malformed(ValueError):
    """A line or a message that is not what the channel carries (the reason in words)."""


class MessageTooLarge(ValueError):
    """A message whose line would pass its bound: never written."""


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode(message: Message, limit: int) -> bytes:
    """``message`` as one line. Raises MessageTooLarge past ``limit`` bytes (the other side
    would skip it: better it is never sent), or ``TypeError`` for what JSON cannot hold."""
    line = _ENCODER.encode(message).encode()
    if len(line) > limit:
        what = message.get("op", "answer")
        raise MessageTooLarge(f"a {what} message of {len(line):,} bytes (at most {limit:,})")
    return line + b"\n"


def decode(line: bytes) -> Message:
    """One line's message. Raises Malformed for bytes that are no JSON (or no UTF-8), JSON
    nested deeper than the reader goes, or JSON that is no object. Linear in the line (Python's
    JSON reader, in C)."""
    try:
        message = json.loads(line)
    except RecursionError as exc:
        raise Malformed("nested too deep") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number past its digits
        raise Malformed(f"not JSON: {str(exc)[:100]}") from exc
    if not isinstance(message, dict):
        raise Malformed(f"not a JSON object: {type(message).__name__}")
    return message


def sequence(message: Message) -> int | None:
    """A question's sequence number, None for a notice. Raises Malformed for an ``"n"`` that is
    no integer of 0 or more (an answer could not name it)."""
    n = message.get("n")
    if n is None:
        return None
    if type(n) is not int or n < 0:
        raise Malformed("a sequence number must be an integer of 0 or more")
    return n


def text(message: Message, name: str) -> str:
    """Field ``name``, a string. Raises Malformed when it is missing or of another kind."""
    value = message.get(name)
    if not isinstance(value, str):
        raise Malformed(f"{name!r} must be a string")
    return value


def integer(message: Message, name: str) -> int:
    """Field ``name``, an integer (not a boolean). Raises Malformed otherwise."""
    value = message.get(name)
    if type(value) is not int:
        raise Malformed(f"{name!r} must be an integer")
    return value


class Lines:
    """Whole lines out of bytes as they come, each byte looked at once. A line over ``limit``
    bytes comes out as ``None`` as soon as it passes the bound, and the rest of it, up to its
    newline, is dropped as it arrives."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # of the buffer: no newline there
        self._skipping = False  # inside a line already given out as None

    def feed(self, data: bytes) -> list[bytes | None]:
        lines: list[bytes | None] = []
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return lines
            self._skipping = False
            data = data[end + 1 :]
        buffer, limit = self._buffer, self._limit
        buffer += data
        start, at = 0, self._scanned
        while (end := buffer.find(b"\n", at)) >= 0:
            lines.append(bytes(buffer[start:end]) if end - start <= limit else None)
            start = at = end + 1
        del buffer[:start]
        if len(buffer) > limit:
            lines.append(None)
            buffer.clear()
            self._skipping = True
        self._scanned = len(buffer)
        return lines
