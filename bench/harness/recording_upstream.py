"""An upstream that logs every byte a relay sends it and reads its requests with h11.

The framing battery (``bench/harness/framing_battery.py``) puts it behind the proxy, Envoy and a
deliberately naive relay, and reads here what each relay made of a client's bytes. h11 is a
parser of its own (pure Python, not llhttp) that reads as RFC 9112 says: ``Transfer-Encoding``
wins over ``Content-Length``, trailers are trailers. So a request a relay framed one way and the
upstream reads another shows up here as a request the client never sent.

Each request it reads is answered ``200`` with ``X-Seen: <its target>`` and ``Content-Length``
framing; what h11 refuses is answered ``400`` and the connection closed. :attr:`connections`
keeps, per connection, the raw bytes, each request as parsed (the head's fields as sent, the
body, the trailer fields), and whether the connection was left mid-request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import h11

from bench.harness.raw_http import RawServer

SEEN = b"x-seen"  # the answer's field naming the target the upstream read


@dataclass
class Parsed:
    """One request as the upstream read it."""

    method: bytes
    target: bytes
    version: bytes
    fields: list[tuple[bytes, bytes]]  # the head's, names as sent
    body: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    head: bytes = b""  # the head's raw bytes, as the relay wrote them
    complete: bool = False  # its body ended

    def field_values(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.fields if n.lower() == name]


@dataclass
class UpstreamConnection:
    raw: bytearray = field(default_factory=bytearray)
    requests: list[Parsed] = field(default_factory=list)
    error: str | None = None  # what h11 refused
    closed: bool = False
    mid_request: bool = False  # bytes of a request that has not ended have arrived

    @property
    def at_rest(self) -> bool:
        """Closed, or open between requests (nothing half-sent waiting on it)."""
        return self.closed or not self.mid_request


def _head_bytes(raw: bytes, start: int) -> bytes:
    end = raw.find(b"\r\n\r\n", start)
    return raw[start : end + 4] if end >= 0 else raw[start:]


class RecordingUpstream:
    """A TCP server on 127.0.0.1:0 (the module docstring)."""

    def __init__(self) -> None:
        self.connections: list[UpstreamConnection] = []
        self.log: list[Parsed] = []  # every request read, in the order they began
        self._errors: list[str] = []
        self._server = RawServer(self._accept)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def errors(self) -> list[str]:
        """What h11 refused, in the order it did (one per connection that sent it)."""
        return self._errors

    def mark(self) -> list[int]:
        """How many bytes each connection has sent so far (for :meth:`at_rest_since`)."""
        return [len(c.raw) for c in self.connections]

    def at_rest_since(self, mark: list[int]) -> bool:
        """Every connection that opened or sent bytes since ``mark`` is at rest."""
        return all(
            c.at_rest
            for n, c in enumerate(self.connections)
            if n >= len(mark) or len(c.raw) != mark[n]
        )

    async def __aenter__(self) -> RecordingUpstream:
        await self._server.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.__aexit__(*exc)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = UpstreamConnection()
        self.connections.append(connection)
        try:
            await self._serve(connection, reader, writer)
        finally:
            connection.closed = True

    async def _serve(
        self, connection: UpstreamConnection, reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        parsing: Parsed | None = None
        start = 0  # where the request being read began in the raw bytes
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                connection.error = str(exc)
                self._errors.append(str(exc))
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            if event is h11.PAUSED:  # a CONNECT it answered 200: a tunnel from here on
                connection.mid_request = True  # nothing after it is a request
                while data := await reader.read(65536):
                    connection.raw += data
                return
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return
                if not connection.mid_request:
                    start = len(connection.raw)
                connection.raw += data
                connection.mid_request = True
                h.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = _head_bytes(bytes(connection.raw), start)
                parsing = Parsed(
                    event.method, event.target, event.http_version,
                    list(event.headers.raw_items()), head=head,
                )  # fmt: skip
                connection.requests.append(parsing)
                self.log.append(parsing)
            elif isinstance(event, h11.Data) and parsing is not None:
                parsing.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) and parsing is not None:
                parsing.trailers = list(event.headers.raw_items())
                parsing.complete = True
                body = b'{"seen": "%b"}' % parsing.target
                answer = h11.Response(status_code=200, headers=[
                    (b"Content-Length", str(len(body)).encode()), (b"X-Seen", parsing.target),
                ])  # fmt: skip
                if parsing.method == b"CONNECT":  # honoured: a tunnel from the end of the head
                    answer = h11.Response(status_code=200, headers=[(b"X-Seen", parsing.target)])
                    writer.write(h.send(answer) or b"")
                    continue  # h11 pauses: what comes next is tunnel bytes
                out = [h.send(answer), h.send(h11.Data(body)), h.send(h11.EndOfMessage())]
                writer.write(b"".join(part for part in out if part))
                parsing = None
                if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
                    return
                h.start_next_cycle()
                start = len(connection.raw) - len(h.trailing_data[0])
                connection.mid_request = bool(h.trailing_data[0])
            elif isinstance(event, h11.ConnectionClosed):
                return
