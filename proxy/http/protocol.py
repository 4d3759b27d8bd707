"""The proxy's HTTP/1.1 server, one client connection: the asyncio glue around its protocol
state, ``proxy.http.core`` (no I/O: bytes in, events and commands out). This module owns what
the core cannot: the transport (reads fed to the core, its commands carried out, the writes of
answers and bodies, backpressure), the requests' bodies as they arrive (``proxy.messages``) and
the handler's task for each request served. The server holding every connection to the
configured limits is ``proxy.http.server`` (what a connection uses of it:
:class:`ConnectionOwner`).

Why not aiohttp's server (the proxy used it until issue 37): it builds a request object, a
response object, a header multidict and a writer per call, and writes a response's head on its
own before the body; for a call of a few milliseconds that was a third of the proxy's CPU. Here a
request is a few fields from the core's head, and an answer's head leaves with the body that is
ready with it (:mod:`proxy.messages`).

When the connection is lost (FIN or RST, whatever the handler is doing) the server's ``on_lost``
is called first, then the handler's task is cancelled: that is how a hang-up is seen in every
stage (``proxy.http.relay``). A FIN alone closes the connection too (docs/proxy.md, "Half-closed
connections"). A refused request is logged with a one-line warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, cast

from hangup_contract.runtime.connections import CloseReason
from proxy.http.core import HttpCore
from proxy.http.events import (
    BodyBroken,
    Close,
    Command,
    Data,
    EndOfMessage,
    Event,
    Linger,
    PauseReading,
    Refused,
    RequestHead,
    ResumeReading,
    Send,
    Serve,
)
from proxy.messages import Answer, Request, Stream

SERVER_LOGGER = "hangup.proxy.http.server"
log = logging.getLogger(SERVER_LOGGER)

Handler = Callable[[Request], Awaitable[Answer | Stream | None]]


class ConnectionOwner(Protocol):
    """What a connection uses of the server holding it (``proxy.http.server.HttpServer``)."""

    loop: asyncio.AbstractEventLoop
    handler: Handler
    on_lost: Callable[[HttpConnection], None]  # a connection with a request under way is lost
    error: Callable[[int, str], Answer]  # the answer to a request the proxy failed (500)
    max_header_size: int
    max_headers: int
    closing: bool

    def refusal(self, status: int, message: str) -> bytes:
        """The whole answer to a request refused for ``message`` (it closes the connection)."""

    def opened(self, connection: HttpConnection) -> None: ...

    def lost(self, connection: HttpConnection) -> None: ...

    def note(self, reason: CloseReason) -> None:
        """Count a close for ``reason``."""


class HttpConnection(asyncio.Protocol):
    """One client connection: its reads through the core, the handler run for each request the
    core serves, its answers written."""

    __slots__ = (
        "_closing", "_drained", "_loop", "_parsing", "_server", "_task", "_waiting",
        "_write_paused", "_wrote", "closed", "core", "handling", "remote", "transport",
    )  # fmt: skip

    def __init__(self, server: ConnectionOwner) -> None:
        self._server = server
        self._loop = server.loop
        self.core = HttpCore(
            max_header_size=server.max_header_size,
            max_headers=server.max_headers,
            refusal_answer=server.refusal,
            now=self._loop.time(),
        )
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.closed = False  # lost: asyncio said so
        self._closing = False  # closed by the proxy, or by the client: nothing more is written
        self._parsing: Request | None = None  # the request whose body is arriving
        self._waiting: deque[Request] = deque()  # parsed, not served yet (the core's count)
        self.handling: Request | None = None  # the request whose handler runs
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._wrote = False  # bytes went out for the request being handled

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        self._server.opened(self)

    def data_received(self, data: bytes) -> None:
        self._carry_out(self.core.receive(data, self._loop.time()))

    def eof_received(self) -> bool | None:
        return None  # a half-close is a hang-up: the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.core.close()
        self._server.lost(self)
        gone = ConnectionResetError("the client's connection was lost")
        request = self.handling
        if request is not None:
            self._server.on_lost(self)
            request.content.fail(gone)
        for waiting in self._waiting:
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
        self.core.close()
        if self.transport is not None and not self.closed:
            self.transport.close()

    def pause_reading(self) -> None:
        if self.core.pause():
            self._pause()

    def resume_reading(self) -> None:
        if self.core.resume():
            self._resume()

    def note(self, reason: CloseReason) -> None:
        self._server.note(reason)

    def busy(self) -> bool:
        return self.core.serving

    # the core's events and commands

    def _carry_out(self, said: Iterable[Event | Command]) -> None:
        for event in said:  # by exact type, the most frequent first: this runs for every call
            if type(event) is RequestHead:
                request = Request(self, *event)
                self._parsing = request
                self._waiting.append(request)
            elif type(event) is Serve:
                self._start(self._waiting.popleft())
            elif type(event) is Data:
                parsing = self._parsing
                assert parsing is not None, "the core sent a body with no head"
                parsing.content.feed(event.data)
            elif type(event) is EndOfMessage:
                parsing = self._parsing
                assert parsing is not None, "the core ended a body with no head"
                parsing.content.feed_eof()
                self._parsing = None
            else:
                self._do(event)

    def _do(self, command: Event | Command) -> None:
        """Carry out a command (or log a refusal, fail a broken body)."""
        if isinstance(command, Send):
            self.write(command.data)
        elif isinstance(command, Refused):
            log.warning("bad request from %s: %s", self.remote, command.error.message)
        elif isinstance(command, BodyBroken):
            assert self._parsing is not None, "the core broke a body with no head"
            self._parsing.content.fail(command.error)
        elif isinstance(command, Linger):
            self._linger(command.seconds)
        elif isinstance(command, Close):
            self.close()
        elif isinstance(command, PauseReading):
            self._pause()
        elif isinstance(command, ResumeReading):
            self._resume()
        else:  # an event out of place: the core's bug
            raise AssertionError(f"not a command: {command!r}")

    def _pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _linger(self, seconds: float) -> None:
        """The answer is followed by a FIN at once, and what the client still sends is read and
        dropped (by the core) until it closes, for at most ``seconds``."""
        transport = self.transport
        self.handling = None  # nothing is under way: a shutdown may close it
        if transport is None or self._closing or transport.is_closing():
            return
        if not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        self._loop.call_later(seconds, self.close)

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
        self.handling = None
        said = self.core.answered(self._loop.time(), close=close or self._server.closing)
        if said:
            self._carry_out(said)
