"""Server-sent events framing, without I/O (the text/event-stream format of the HTML standard).

``encode`` turns one event into bytes; ``SSEDecoder`` turns bytes, split anywhere, into events.
Lines end in LF, CRLF or CR; a field line is ``name: value`` (one optional space stripped);
lines starting with ``:`` are comments; a blank line dispatches the event. Unknown fields are
ignored, as the standard says, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    event: str | None = None
    id: str | None = None


def encode(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One event as bytes. Multi-line ``data`` becomes one ``data:`` line per line."""
    lines: list[str] = []
    if event is not None:
        _check_single_line("event", event)
        lines.append(f"event: {event}")
    if id is not None:
        _check_single_line("id", id)
        lines.append(f"id: {id}")
    lines.extend(
        f"data: {line}" for line in data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    )
    return ("\n".join(lines) + "\n\n").encode()


def _check_single_line(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise ValueError(f"SSE {name} must be one line, got {value!r}")


class SSEDecoder:
    """Incremental decoder: ``feed(bytes)`` returns the events completed by those bytes."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[Event]:
        events: list[Event] = []
        data = self._buffer + chunk
        start = 0
        i = 0
        if self._pending_cr and data.startswith(b"\n"):
            start = i = 1  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        while i < len(data):
            byte = data[i]
            if byte in (0x0A, 0x0D):
                line = data[start:i].decode("utf-8", errors="replace")
                if byte == 0x0D:
                    if i + 1 < len(data):
                        if data[i + 1] == 0x0A:
                            i += 1
                    else:
                        self._pending_cr = True
                self._line(line, events)
                start = i + 1
            i += 1
        self._buffer = data[start:]
        return events

    def _line(self, line: str, events: list[Event]) -> None:
        if not line:
            if self._data:
                events.append(Event("\n".join(self._data), self._event, self._id))
            self._data, self._event = [], None
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
