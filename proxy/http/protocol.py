"""The proxy's HTTP/1.1 server, one client connection: an asyncio protocol parsed by httptools
(llhttp, in C). The server that holds every connection to the configured limits is
``proxy.http.server`` (what a connection uses of it: :class:`ConnectionOwner`).

Why not aiohttp's server (the proxy used it until issue 37): it builds a request object, a
response object, a header multidict and a writer per call, and writes a response's head on its
own before the body; for a call of a few milliseconds that was a third of the proxy's CPU. Here a
request is a few fields filled from the parser's callbacks, and an answer's head leaves with the
body that is ready with it (:mod:`proxy.messages`).

Per connection: one request is handled at a time, by the handler in a task of its own; requests
pipelined behind it are parsed and wait (at most ``_PIPELINE`` of them, then reading pauses). When
the connection is lost (FIN or RST, whatever the handler is doing) the server's ``on_lost`` is
called first, then the handler's task is cancelled: that is how a hang-up is seen in every stage
(``proxy.http.relay``). A FIN alone closes the connection too (docs/proxy.md, "Half-closed
connections").

What reaches the handler is a head the upstream can read one way only: what llhttp refuses
(conflicting framing, bad bytes) is answered 400, and so is what llhttp takes but a sidecar must
not relay (``proxy.http.head_rules``: ``CONNECT``, a target that is not a path or carries a
fragment, ``Host`` missing or repeated, other versions and transfer codings). Trailer fields
(after a chunked body's last chunk) are counted against the limits and dropped: llhttp calls
back for them as for header fields, and they must never join the request's fields.

A request line longer than ``max_header_size`` is answered 414, a header field longer or more
than ``max_headers`` of them 431, anything llhttp cannot parse 400, each with a one-line warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import httptools

from hangup_contract.runtime.connections import CloseReason
from proxy.errors import BadBody
from proxy.http.head_rules import refusal
from proxy.messages import Answer, Request, Stream

SERVER_LOGGER = "hangup.proxy.http.server"
log = logging.getLogger(SERVER_LOGGER)

_PIPELINE = 16  # requests parsed ahead of the one being handled before reading pauses
_LINGER_S = 10.0  # how long the rest of an unread body is read and dropped before the close

Handler = Callable[[Request], Awaitable[Answer | Stream | None]]


class _Refused(Exception):
    """A request head over the limits: answered with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConnectionOwner(Protocol):
    """What a connection uses of the server holding it (``proxy.http.server.HttpServer``)."""

    loop: asyncio.AbstractEventLoop
    handler: Handler
    on_lost: Callable[[HttpConnection], None]  # a connection with a request under way is lost
    error: Callable[[int, str], Answer]  # the answer to a request refused for its message
    max_header_size: int
    max_headers: int
    closing: bool

    def opened(self, connection: HttpConnection) -> None: ...

    def lost(self, connection: HttpConnection) -> None: ...

    def note(self, reason: CloseReason) -> None:
        """Count a close for ``reason``."""


class HttpConnection(asyncio.Protocol):
    """One client connection: parses its requests and runs the handler for each in turn."""

    def __init__(self, server: ConnectionOwner) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.closed = False  # lost: asyncio said so
        self._closing = False  # closed by the proxy, or by the client: nothing more is written
        # What the sweep reads: when the connection went quiet, when a head began arriving.
        self.quiet_since = 0.0
        self.head_started = 0.0
        self.partial = False  # bytes of a request head have arrived, the head is not complete
        self._url = b""
        self._fields: list[tuple[str, str]] = []
        self._hosts: list[bytes] = []  # the head's Host values (head_rules)
        self._codings: list[bytes] = []  # ... and its Transfer-Encoding values
        self._trailing = False  # the head is complete: fields now are trailer fields
        self._trailers = 0  # ... counted against the limits, never kept
        self._length: int | None = None
        self._chunked = False
        self._parsing: Request | None = None  # the request whose body is arriving
        self.handling: Request | None = None  # the request whose handler runs
        self._task: asyncio.Task[None] | None = None
        self._pipeline: deque[Request] = deque()
        self._refusal: _Refused | None = None  # a bad request behind the one being handled
        self._reading_paused = 0  # reasons reading is paused (a full body, a full pipeline)
        self._upgraded = False  # llhttp stopped at an Upgrade: nothing more can be parsed
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._wrote = False  # bytes went out for the request being handled
        self.lingering = False  # answered and shut for writing: what still comes is dropped

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        self.quiet_since = self._loop.time()
        self._server.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self._upgraded or self.lingering:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgraded = True  # answered, then the connection closes
        except _Refused as exc:
            self._refuse(exc)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ or exc.__cause__
            if not isinstance(cause, _Refused):
                cause = _Refused(400, f"the request could not be parsed: {cause or exc}")
            self._refuse(cause)
        except httptools.HttpParserError as exc:
            self._refuse(_Refused(400, f"the request could not be parsed: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # a half-close is a hang-up: the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._server.lost(self)
        gone = ConnectionResetError("the client's connection was lost")
        request = self.handling
        if request is not None:
            self._server.on_lost(self)
            request.content.fail(gone)
        for waiting in self._pipeline:
            waiting.content.fail(gone)
        if self._parsing is not None:
            self._parsing.content.fail(gone)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(gone)
            self._drained.exception()  # retrieved: the writer may have gone

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # what answers and bodies use

    def write(self, data: bytes) -> None:
        """Write ``data`` unless the connection is closing: a response cut short must not be
        completed by a later write (its last chunk) into a closing transport's buffer."""
        transport = self.transport
        if transport is not None and not self._closing and not transport.is_closing():
            transport.write(data)
            self._wrote = True

    async def drain(self) -> None:
        """Return once the client's connection can take more; ``ConnectionResetError`` if it
        is lost."""
        if self.closed:
            raise ConnectionResetError("the client's connection is closed")
        if not self._write_paused:
            return
        if self._drained is None:
            self._drained = self._loop.create_future()
        await asyncio.shield(self._drained)

    def close(self) -> None:
        self._closing = True
        if self.transport is not None and not self.closed:
            self.transport.close()

    def pause_reading(self) -> None:
        self._reading_paused += 1
        if self._reading_paused == 1 and self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        self._reading_paused -= 1
        if self._reading_paused == 0 and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def note(self, reason: CloseReason) -> None:
        self._server.note(reason)

    def busy(self) -> bool:
        return self.handling is not None

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._url, self._fields, self._length, self._chunked = b"", [], None, False
        self._hosts, self._codings, self._trailing, self._trailers = [], [], False, 0
        self.partial = True
        self.head_started = self._loop.time()

    def on_url(self, url: bytes) -> None:
        self._url += url
        limit = self._server.max_header_size
        if len(self._url) > limit:
            raise _Refused(414, f"the request target is longer than {limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        server = self._server
        if len(name) + len(value) > server.max_header_size:
            field = name[:64].decode("latin-1")
            raise _Refused(431, f"header {field!r} is longer than {server.max_header_size} bytes")
        if len(self._fields) + self._trailers >= server.max_headers:
            raise _Refused(431, f"more than {server.max_headers} header fields")
        if self._trailing:
            # A trailer field (after a chunked body's last chunk; llhttp calls back for those
            # too): never merged into the head (RFC 9110 section 6.5.1), so it cannot say what
            # a front door stripped from the head. Dropped, as Envoy does by default.
            self._trailers += 1
            return
        size = len(name)
        if size == 4 and name.lower() == b"host":
            self._hosts.append(value)
        elif size == 14 and name.lower() == b"content-length":
            self._length = int(value)  # digits only: llhttp has checked them
        elif size == 17 and name.lower() == b"transfer-encoding":
            self._chunked = True  # llhttp refuses what it cannot frame
            self._codings.append(value)
        self._fields.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._trailing = True
        method = parser.get_method()
        version = parser.get_http_version()
        refused = refusal(method, self._url, version, self._hosts, self._codings)
        if refused is not None:
            raise _Refused(*refused)
        request = Request(
            self,
            method.decode("ascii", "replace"),
            self._url.decode("utf-8", "surrogateescape"),
            (1, 1) if version == "1.1" else (1, 0),
            self._fields,
            keep_alive=parser.should_keep_alive() and not parser.should_upgrade(),
            content_length=self._length,
            chunked=self._chunked,
        )
        self.partial = False
        self.quiet_since = self._loop.time()
        self._parsing = request
        if self.handling is None:
            self._start(request)
        else:
            self._pipeline.append(request)
            if len(self._pipeline) == _PIPELINE:
                self.pause_reading()

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.content.feed(body)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.content.feed_eof()
            self._parsing = None

    # the requests, one at a time

    def _start(self, request: Request) -> None:
        self.handling = request
        self._wrote = False
        self._task = request.task = self._loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            answer = await self._server.handler(request)
        except asyncio.CancelledError:
            # The client left (the connection is gone already), the server is closing, or the
            # proxy stopped the call (a drain that ran out): nothing more will be written, and
            # only a close tells a client that its answer was cut short.
            self._task = None
            self.close()
            return
        except Exception:
            log.exception("the proxy failed a call to %s", request.raw_path[:200])
            # Once part of a response went out, only a close says that it is cut short.
            answer = None if self._wrote else self._server.error(500, "the proxy failed")
        self._answered(request, answer)

    def _answered(self, request: Request, answer: Answer | Stream | None) -> None:
        self._task = None
        transport = self.transport
        if self.closed or self._closing or transport is None or transport.is_closing():
            return
        if isinstance(answer, Answer):
            close = answer.write_to(request)
        elif isinstance(answer, Stream) and answer.started:
            close = answer.finish()
        else:  # the handler closed the connection, or has nothing it could finish
            close = True
        if not request.content.is_eof():
            self._linger()
            return
        if close or self._server.closing:
            self.close()
            return
        self.handling = None
        self.quiet_since = self._loop.time()
        if self._pipeline:
            if len(self._pipeline) == _PIPELINE:
                self.resume_reading()
            self._start(self._pipeline.popleft())
        elif self._refusal is not None:
            self._refuse(self._refusal)
        elif self._upgraded:
            self.close()

    def _linger(self) -> None:
        """Close a connection whose request body was not read to its end (413, 408, a call
        refused before its body): the answer is followed by a FIN at once, and what the client
        still sends is read and dropped until it closes, for at most ``_LINGER_S`` (nginx's
        ``lingering_close``). Closing with unread bytes would send a reset, which can destroy the
        answer before the client reads it."""
        transport = self.transport
        if transport is None or self._closing or transport.is_closing():
            return
        if not transport.can_write_eof():
            self.close()
            return
        self.lingering = True
        self.handling = None  # nothing is under way: a shutdown may close it
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = 0
            transport.resume_reading()
        self._loop.call_later(_LINGER_S, self.close)

    def _refuse(self, refusal: _Refused) -> None:
        """Answer a request the parser refused, and close: nothing after it can be framed. A
        body that breaks off is its request's to answer: reading it fails (``BadBody``)."""
        if self._parsing is not None:
            self._parsing.content.fail(BadBody(f"the request body is broken: {refusal.message}"))
            self._upgraded = True  # parse nothing more: the connection closes after it
            return
        if self.handling is not None:  # its turn comes once the request being handled is done
            self._refusal = refusal
            self._upgraded = True
            return
        log.warning("bad request from %s: %s", self.remote, refusal.message)
        answer = self._server.error(refusal.status, refusal.message)
        answer.force_close()
        self.write(answer.encode("GET", (1, 1), False)[0])
        self._linger()  # the rest of an oversized head may still be arriving
