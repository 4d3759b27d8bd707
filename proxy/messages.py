"""A request as the proxy's HTTP/1.1 server (``proxy.http.protocol``) reads it (:class:`Request`,
its :class:`RequestBody`), and the two kinds of answer it writes: :class:`Answer`, whole (an
error, a scrape, a Triton answer), and :class:`Stream`, written as its body arrives (a relayed
response, an event stream).

A stream's head is held until its first bytes of body (or its end, or :meth:`Stream.flush`),
so a head and the body that is ready with it leave in one write. Framing is the server's:
``Content-Length`` when the answer names one, else chunked for an HTTP/1.1 client, else the end
of the connection; no body for ``HEAD``, 1xx, 204 and 304.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import NamedTuple, Protocol
from urllib.parse import unquote

from hangup_contract.runtime.connections import CloseReason, chunks_until_stalled
from proxy.labels import SERVER_HEADER

Headers = list[tuple[str, str]]

_BODY_HIGH = 256 * 1024  # body bytes held unread before reading from the client pauses
_BODY_LOW = 64 * 1024  # ... and resumes
_NO_BODY_STATUSES = frozenset({204, 304})
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class ClientConnection(Protocol):
    """What a request and its answer use of the client connection they came on."""

    transport: asyncio.Transport | None
    remote: str | None  # the client's address
    closed: bool

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None:
        """Return once the connection can take more; ``ConnectionResetError`` if it is lost."""
        ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def note(self, reason: CloseReason) -> None:
        """Count the connection as closed for ``reason``."""


class RequestBody:
    """A request's body as it arrives. Reading from the client pauses while more than 256 KiB
    wait unread, so a client cannot fill the proxy's memory faster than the upstream takes it."""

    __slots__ = ("_chunks", "_connection", "_eof", "_error", "_paused", "_size", "_waiter")

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._wake()
        if self._size > _BODY_HIGH and not self._paused:
            self._paused = True
            self._connection.pause_reading()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """The body will not end: the client left (a reader gets ``error``)."""
        if not self._eof:
            self._error = error
            self._wake()

    def is_eof(self) -> bool:
        """The whole body has arrived (read or not)."""
        return self._eof

    def exception(self) -> BaseException | None:
        return self._error

    def read_nowait(self) -> bytes:
        """Everything that has arrived and not been read."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._taken(self._size)
        return data

    async def readany(self) -> bytes:
        """The bytes that have arrived and not been read (waiting for the next if none has);
        ``b""`` at the end of the body. All of them at once: a chunked body of one-byte chunks
        is a piece for each chunk from the parser, and a reader that took them one by one (a
        relay writing each upstream) spent a thousand times the CPU a byte of a plain body
        costs."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if len(self._chunks) == 1:
            chunk = self._chunks.popleft()
        else:  # many small chunks of a chunked body: one piece for the reader, not one each
            chunk = b"".join(self._chunks)
            self._chunks.clear()
        self._taken(len(chunk))
        return chunk

    def chunks(self, stall_limit: float) -> AsyncIterator[bytes]:
        """The body as it arrives, ``BodyStalled`` when no byte of it comes for ``stall_limit``
        seconds (the connection then counted as closed for ``body_timeout``)."""
        return chunks_until_stalled(
            self.readany, stall_limit, lambda: self._connection.note(CloseReason.BODY_TIMEOUT)
        )

    def _taken(self, size: int) -> None:
        self._size -= size
        if self._paused and self._size <= _BODY_LOW:
            self._paused = False
            self._connection.resume_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Request:
    """One request's head, its body as it arrives, and the connection it came on."""

    __slots__ = (
        "_path",
        "chunked",
        "connection",
        "content",
        "content_length",
        "headers",
        "keep_alive",
        "method",
        "raw_path",
        "remote",
        "task",
        "version",
    )

    scheme = "http"

    def __init__(
        self,
        connection: ClientConnection,
        method: str,
        raw_path: str,
        version: tuple[int, int],
        headers: Headers,
        keep_alive: bool,
        content_length: int | None,
        chunked: bool,
    ) -> None:
        # The fields after the connection in the order of proxy.http.events.RequestHead's: the
        # server makes a request as Request(connection, *head).
        self.connection = connection
        self.method = method
        self.raw_path = raw_path  # the target as sent: path and query
        self.version = version
        self.headers = headers  # as sent: order and repeats kept
        self.keep_alive = keep_alive  # the client will send another request on this connection
        self.content_length = content_length
        self.chunked = chunked
        self.remote = connection.remote
        self.content = RequestBody(connection)
        self.task: asyncio.Task[None] | None = None  # what handles it, once its turn came
        self._path: str | None = None

    @property
    def path(self) -> str:
        """The target's path, percent-decoded, without the query."""
        if self._path is None:
            self._path = unquote(self.raw_path.partition("?")[0], errors="surrogateescape")
        return self._path

    @property
    def path_qs(self) -> str:
        return self.raw_path

    @property
    def body_exists(self) -> bool:
        return self.chunked or bool(self.content_length)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        lowered = name.lower()
        return next((v for n, v in self.headers if n.lower() == lowered), None)


class _Date:
    """The ``Date`` header field, made once a second."""

    second = -1
    field = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.field = second, f"Date: {formatdate(second, usegmt=True)}".encode()
        return cls.field


class HeadFields(NamedTuple):
    """A head's header fields, encoded (``Name: value`` lines), and whether they name the
    body's length and the date (the server adds what they do not)."""

    lines: list[bytes]
    sized: bool
    dated: bool


def encoded(headers: Iterable[tuple[str, str]]) -> HeadFields:
    """``headers`` as a head carries them."""
    lines: list[bytes] = []
    sized = dated = False
    for name, value in headers:
        lines.append(f"{name}: {value}".encode("latin-1", "replace"))
        lowered = name.lower()
        if lowered == "content-length":
            sized = True
        elif lowered == "date":
            dated = True
    return HeadFields(lines, sized, dated)


def _head(
    method: str, version: tuple[int, int], keep_alive: bool, status: int, reason: str | None,
    fields: HeadFields, *, body: bool, close: bool,
) -> tuple[bytes, bool, bool]:  # fmt: skip
    """A response head for a request (its method, version, whether its client keeps the
    connection); with whether its body goes chunked and whether the connection must close after
    it (a body with no length and no chunked encoding is framed by the close)."""
    line = f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Unknown')}"
    lines = [line.encode("latin-1", "replace"), *fields.lines]
    if not fields.dated:
        lines.append(_Date.now())
    sized = fields.sized
    body = body and method != "HEAD" and status >= 200 and status not in _NO_BODY_STATUSES
    chunked = body and not sized and version >= (1, 1)
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
    close = close or not keep_alive or (body and not sized and not chunked)
    if close:
        if version >= (1, 1):
            lines.append(b"Connection: close")
    elif version < (1, 1):
        lines.append(b"Connection: keep-alive")
    lines.append(b"\r\n")
    return b"\r\n".join(lines), chunked, close


class Answer:
    """A whole answer: written, head and body in one write, once the handler returns it."""

    started = False

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers: dict[str, str] = dict(headers or {})
        self.closes = False

    def force_close(self) -> None:
        """Close the connection after this answer."""
        self.closes = True

    def write_to(self, request: Request) -> bool:
        """Write the answer; returns whether the connection must close after it."""
        data, close = self.encode(request.method, request.version, request.keep_alive)
        request.connection.write(data)
        return close

    def encode(self, method: str, version: tuple[int, int], keep_alive: bool) -> tuple[bytes, bool]:
        """Head and body, for a request of ``method`` and ``version``; with whether the
        connection closes after it."""
        headers = list(self.headers.items())
        if self.content_type is not None:
            headers.append(("Content-Type", self.content_type))
        headers.append(("Content-Length", str(len(self.body))))
        fields = encoded(headers)
        head, _, close = _head(
            method, version, keep_alive, self.status, None, fields, body=False, close=self.closes
        )
        return (head if method == "HEAD" else head + self.body), close


class Stream:
    """An answer written as its body arrives: :meth:`start`, :meth:`send` each chunk (or
    ``await write``), then :meth:`finish`. The head waits for the first chunk."""

    started = False

    def __init__(
        self,
        status: int,
        reason: str | None = None,
        headers: Headers | None = None,
        *,
        fields: HeadFields | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers: Headers = headers if headers is not None else []
        self.fields = fields  # the fields already encoded (a relayed head): then not ``headers``
        self.closes = False
        self.chunked = False
        self.finished = False
        self._request: Request | None = None
        self._pending = b""  # the head, until the first chunk takes it along

    def force_close(self) -> None:
        """Close the connection after this answer."""
        self.closes = True

    @property
    def sent(self) -> bool:
        """Its head has been written to the client (another answer can no longer be)."""
        return self.started and not self._pending

    def start(self, request: Request) -> None:
        """Fix the head (sent with the first chunk). Raises ``ConnectionResetError`` when the
        client has already left."""
        if request.connection.closed:
            raise ConnectionResetError("the client's connection is closed")
        self._pending, self.chunked, self.closes = _head(
            request.method,
            request.version,
            request.keep_alive,
            self.status,
            self.reason,
            self.fields if self.fields is not None else encoded(self.headers),
            body=True,
            close=self.closes,
        )
        self._request = request
        self.started = True

    def send(self, chunk: bytes) -> None:
        """Write one chunk now (with the head, the first time)."""
        assert self._request is not None
        if self.chunked:
            chunk = b"%x\r\n%b\r\n" % (len(chunk), chunk)
        if self._pending:
            chunk, self._pending = self._pending + chunk, b""
        self._request.connection.write(chunk)

    def flush(self) -> None:
        """Write the head now if it still waits (nothing more is ready with it)."""
        if self._pending and self._request is not None:
            self._request.connection.write(self._pending)
            self._pending = b""

    async def write(self, chunk: bytes) -> None:
        """Send one chunk and wait until the client's connection can take more. Raises
        ``ConnectionResetError`` when the client has left."""
        assert self._request is not None
        if self._request.connection.closed:
            raise ConnectionResetError("the client's connection is closed")
        self.send(chunk)
        await self._request.connection.drain()

    def finish(self) -> bool:
        """End the body; returns whether the connection must close after it."""
        if not self.finished and self._request is not None:
            self.finished = True
            end = b"0\r\n\r\n" if self.chunked else b""
            if self._pending or end:
                self._request.connection.write(self._pending + end)
                self._pending = b""
        return self.closes

    async def write_eof(self) -> None:
        self.finish()


def error_answer(status: int, message: str, kind: str = "proxy_error") -> Answer:
    """An error the proxy answers itself: JSON, OpenAI-style (``kind`` its type), naming the
    proxy."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return Answer(
        status,
        json.dumps(body).encode(),
        content_type="application/json",
        headers={"Server": SERVER_HEADER},
    )
