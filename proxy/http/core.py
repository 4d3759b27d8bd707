"""The proxy's HTTP/1.1 server side without I/O: one client connection's protocol state, fed the
bytes the client sends and told when the request it serves has its answer; it returns what the
client sent (events) and what the connection must do (commands, ``proxy.http.events``). No
asyncio, no transport, no clock of its own (the caller passes ``now``): ``proxy.http.protocol``
runs it on a transport, and the tests drive it as a table of bytes in and events out
(tests/pure/test_http_core.py), as h11 and mitmproxy's layers are tested.

Parsing is llhttp's (httptools, in C, strict). llhttp refuses what cannot be framed one way only
(conflicting framing, bad bytes); what it takes and a sidecar must not relay is refused by
``proxy.http.head_rules`` (``CONNECT``, a target that is not a path or carries a fragment,
``Host`` missing or repeated, other versions and transfer codings). A request line longer than
``max_header_size`` is refused 414, a header field longer or more than ``max_headers`` of them
431, anything llhttp cannot parse 400 (:class:`~proxy.errors.RemoteProtocolError`). Trailer
fields (after a chunked body's last chunk) count against the limits and are dropped: llhttp calls
back for them as for header fields, and they must never join the request's fields.

One request is served at a time (:class:`~proxy.http.events.Serve`, then :meth:`HttpCore.answered`
once its answer is written). Requests pipelined behind it are parsed, bodies too, and wait: at
most :data:`PIPELINE`, then reading pauses until one is served. A read is parsed
:data:`SLICE` bytes at a time, and what is left of it once the pipeline is full waits unparsed:
parsed whole, one read of 256 KiB of small requests held 9,708 of them (12 MB). A head refused
behind the one served is answered in its turn, and nothing after it is parsed; a body that
breaks off is its request's to answer (:class:`~proxy.http.events.BodyBroken`). An Upgrade is
served, then the connection closes. The body bytes of one read come as one
:class:`~proxy.http.events.Data` (a body of many small chunks is not an event per chunk).

A request answered before its body ended (413, 408, a call refused before its body was read),
or a head refused, ends in a lingering close (:class:`~proxy.http.events.Linger`): the answer,
a FIN, and what the client still sends read and dropped for :data:`LINGER_S`.

The clocks of ``hangup_contract.runtime.connections`` (a head must arrive within the header
timeout of its first byte; a connection with nothing under way closes after the idle timeout)
run only while no request is served: :meth:`HttpCore.expired` says which one ran out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httptools

from hangup_contract.runtime.connections import CloseReason
from proxy.errors import BadBody, LocalProtocolError, RemoteProtocolError
from proxy.http.events import (
    CLOSE,
    END,
    PAUSE,
    RESUME,
    SERVE,
    BodyBroken,
    Command,
    Event,
    Linger,
    Refused,
    Send,
    data,
    request_head,
)
from proxy.http.head_rules import refusal

PIPELINE = 16  # requests parsed behind the one served before reading pauses
SLICE = 4096  # bytes of a read parsed at a time: the pipeline is looked at between slices
LINGER_S = 10.0  # how long the rest of an unread body is read and dropped before the close
_LINGER = Linger(LINGER_S)
_NOTHING: tuple[Event | Command, ...] = ()

RefusalAnswer = Callable[[int, str], bytes]  # a refused request's whole answer (it closes)
_PARSE_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade, RemoteProtocolError)


class HttpCore:
    """One client connection's HTTP/1.1 state (see the module). ``refusal_answer`` makes the
    bytes answering a refused head, from its status and message."""

    __slots__ = (
        "_bodies", "_body_open", "_chunked", "_codings", "_deferred", "_fields", "_full",
        "_head_started", "_held", "_hosts", "_length", "_max_header_size", "_max_headers",
        "_now", "_out", "_parser", "_partial", "_pieces", "_queued", "_quiet_since",
        "_refusal_answer", "_room", "_stopped", "_trailing", "_url", "closed", "lingering",
        "serving",
    )  # fmt: skip

    def __init__(
        self, *, max_header_size: int, max_headers: int, refusal_answer: RefusalAnswer, now: float
    ) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._max_header_size = max_header_size
        self._max_headers = max_headers
        self._refusal_answer = refusal_answer
        self._out: list[Event | Command] = []  # what the bytes being parsed have said so far
        self._now = now
        # The head being read, and the body bytes of this read.
        self._url = b""
        self._fields: list[tuple[str, str]] = []
        self._hosts: list[bytes] = []  # its Host values (head_rules)
        self._codings: list[bytes] = []  # ... and its Transfer-Encoding values
        self._trailing = False  # the head is complete: fields now are trailer fields
        self._room = max_headers  # fields the head and its trailer may still have
        self._length: int | None = None
        self._chunked = False
        self._pieces: list[bytes] = []  # body bytes parsed, not yet said (one Data a read)
        # The connection.
        self.serving = False  # a request is with the handler, its answer not written yet
        self.lingering = False  # answered and shut for writing: what still comes is dropped
        self.closed = False  # closed, by a command or by the caller
        self._queued = 0  # heads parsed behind the one served, waiting for their turn
        self._held = b""  # what was read once the pipeline was full, not parsed yet
        self._body_open = False  # the last head's body has not ended (or it broke off)
        self._stopped = False  # nothing more is parsed: an Upgrade, a refusal
        self._deferred: RemoteProtocolError | None = None  # a refusal behind the one served
        self._full = False  # reading paused for the pipeline
        self._bodies = 0  # ... and for bodies holding too much unread (pause, resume)
        # What the clocks read: when the connection went quiet, when a head began arriving.
        self._partial = False  # bytes of a head have arrived, the head is not complete
        self._head_started = 0.0
        self._quiet_since = now

    # What the caller tells it

    def receive(self, data: bytes, now: float) -> list[Event | Command]:
        """The client sent ``data``: what it says, and what to do. Nothing once the connection
        lingers, is closed, or parses no more; nothing yet while the pipeline is full (it is
        parsed once requests are served)."""
        if self._stopped or self.lingering or self.closed:
            return []
        if self._full:  # read on before the pause took: it waits its turn
            self._held += data
            return []
        self._now = now
        out = self._out = []
        try:  # _parse's, inline: this runs for every read
            if len(data) <= SLICE:
                self._parser.feed_data(data)
            else:
                self._sliced(memoryview(data))
        except _PARSE_ERRORS as exc:
            self._failed(exc)
        if self._pieces:
            self._said_body()
        return out

    def answered(self, now: float, *, close: bool) -> Sequence[Event | Command]:
        """The request served has its answer written; ``close``: the answer (or the server)
        closes the connection after it. What to do next: serve the next request (with what
        the bytes held back say), answer a refusal that waited, linger, close, or nothing (wait
        for the next request). ``LocalProtocolError`` when no request is served."""
        if not self.serving:
            raise LocalProtocolError("an answer with no request served")
        self.serving = False
        if not self._queued and self._body_open:  # its body has not ended: it is left unread
            out: list[Event | Command] = []
            self._linger(out)
            return out
        if close:
            self.closed = True
            return (CLOSE,)
        self._quiet_since = now
        if self._queued:
            return self._next(now)
        if self._deferred is not None:
            out = []
            self._answer_refusal(self._deferred, out)
            return out
        if self._stopped:
            self.closed = True
            return (CLOSE,)
        return _NOTHING

    def pause(self) -> bool:
        """A body holds too much unread: whether reading must stop now."""
        if self.lingering:
            return False
        self._bodies += 1
        return self._bodies == 1 and not self._full

    def resume(self) -> bool:
        """A body was read down: whether reading must start again now."""
        if not self._bodies:
            return False  # lingering: reading was resumed for good
        self._bodies -= 1
        return not self._bodies and not self._full

    def close(self) -> None:
        """The connection is closed by the caller (a limit, a shutdown, a handler cut short)."""
        self.closed = True

    def expired(self, now: float, header_timeout: float, idle_timeout: float) -> CloseReason | None:
        """Which clock ran out at ``now``, if one did (0: no limit). A lingering or closed
        connection has its own end; while a request is served neither clock runs."""
        if self.lingering or self.closed:
            return None
        if self.serving:
            self._quiet_since, self._partial = now, False
            return None
        if self._partial:
            if header_timeout and now - self._head_started > header_timeout:
                return CloseReason.HEADER_TIMEOUT
            return None
        if idle_timeout and now - self._quiet_since > idle_timeout:
            return CloseReason.IDLE_TIMEOUT
        return None

    # Parsing

    def _parse(self, data: bytes) -> None:
        """Feed ``data`` to llhttp, ``SLICE`` bytes at a time while the pipeline has room; what
        says something goes to ``self._out``."""
        try:
            if len(data) <= SLICE:
                self._parser.feed_data(data)
            else:
                self._sliced(memoryview(data))
        except _PARSE_ERRORS as exc:
            self._failed(exc)
        if self._pieces:
            self._said_body()

    def _failed(self, exc: Exception) -> None:
        """What llhttp or a callback raised, as the refusal it is (or the Upgrade)."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            self._stopped = True  # served, then the connection closes
        elif isinstance(exc, RemoteProtocolError):
            self._refuse(exc)
        elif isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__ or exc.__cause__
            if not isinstance(cause, RemoteProtocolError):
                cause = RemoteProtocolError(f"the request could not be parsed: {cause or exc}")
            self._refuse(cause)
        else:
            self._refuse(RemoteProtocolError(f"the request could not be parsed: {exc}"))

    def _sliced(self, data: memoryview) -> None:
        feed = self._parser.feed_data
        for start in range(0, len(data), SLICE):
            if self._queued >= PIPELINE:
                self._held = bytes(data[start:])
                return
            feed(data[start : start + SLICE])

    def _next(self, now: float) -> list[Event | Command]:
        """Serve the next request waiting; parse what was held back while the pipeline was full,
        and resume reading once nothing is held and the pipeline has room."""
        self._queued -= 1
        self.serving = True
        out = self._out = [SERVE]
        if self._held and self._queued < PIPELINE:
            held, self._held = self._held, b""
            self._now = now
            self._parse(held)
        if self._full and self._queued < PIPELINE and not self._held:
            self._full = False
            if not self._bodies:
                out.append(RESUME)
        return out

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._url, self._fields, self._length, self._chunked = b"", [], None, False
        self._hosts, self._codings, self._trailing = [], [], False
        self._room = self._max_headers
        self._partial = True
        self._head_started = self._now

    def on_url(self, url: bytes) -> None:
        self._url += url
        limit = self._max_header_size
        if len(self._url) > limit:
            raise RemoteProtocolError(f"the request target is longer than {limit} bytes", 414)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)
        if size + len(value) > self._max_header_size:
            field = name[:64].decode("latin-1")
            limit = self._max_header_size
            raise RemoteProtocolError(f"header {field!r} is longer than {limit} bytes", 431)
        self._room -= 1
        if self._room < 0:
            raise RemoteProtocolError(f"more than {self._max_headers} header fields", 431)
        if self._trailing:
            # A trailer field (after a chunked body's last chunk; llhttp calls back for those
            # too): counted against the limits, never merged into the head (RFC 9110 section
            # 6.5.1), so it cannot say what a front door stripped from the head. Dropped, as
            # Envoy does by default.
            return
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
            raise RemoteProtocolError(refused.message, refused.status)
        head = request_head((
            method.decode("ascii", "replace"),
            self._url.decode("utf-8", "surrogateescape"),
            (1, 1) if version == "1.1" else (1, 0),
            self._fields,
            parser.should_keep_alive() and not parser.should_upgrade(),
            self._length,
            self._chunked,
        ))  # fmt: skip
        self._partial = False
        self._quiet_since = self._now
        self._body_open = True
        out = self._out
        out.append(head)
        if not self.serving:
            self.serving = True
            out.append(SERVE)
            return
        self._queued += 1
        if self._queued == PIPELINE and not self._full:
            self._full = True
            if not self._bodies:
                out.append(PAUSE)

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        pieces = self._pieces
        if pieces:  # _said_body's, inline: this runs for every request with a body
            self._out.append(data(b"".join(pieces)))
            pieces.clear()
        self._out.append(END)
        self._body_open = False

    def _said_body(self) -> None:
        self._out.append(data(b"".join(self._pieces)))
        self._pieces.clear()

    # Refusals and their ends

    def _refuse(self, error: RemoteProtocolError) -> None:
        """A refusal from the parser: nothing after it can be framed. A body that breaks off is
        its request's to answer; a head is answered now, or after the request served."""
        self._stopped = True
        self._held = b""
        if self._body_open:
            if self._pieces:
                self._said_body()
            self._out.append(BodyBroken(BadBody(f"the request body is broken: {error.message}")))
        elif self.serving:
            self._deferred = error
        else:
            self._answer_refusal(error, self._out)

    def _answer_refusal(self, error: RemoteProtocolError, out: list[Event | Command]) -> None:
        self._deferred = None
        out.append(Refused(error))
        out.append(Send(self._refusal_answer(error.status, error.message)))
        self._linger(out)  # the rest of an oversized head may still be arriving

    def _linger(self, out: list[Event | Command]) -> None:
        self.lingering = True
        self.serving = False
        self._held = b""
        if self._full or self._bodies:
            self._full, self._bodies = False, 0
            out.append(RESUME)
        out.append(_LINGER)
