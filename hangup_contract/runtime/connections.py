"""Bounds on what one client connection may hold, for every HTTP listener of both processes.

- ``header_timeout``: once a connection has sent the first byte of a request head, it has this
  long to complete it; then it is closed. A client that trickles header bytes (slowloris) holds
  a connection no longer than this (plus the idle time before its first byte).
- ``idle_timeout``: a keep-alive connection with no request under way and nothing sent is closed
  after this long.
- ``max_connections``: open client connections per listener; one more is closed as it opens
  (0: no limit).
- ``body_timeout``: while a request body is being read, the longest wait for its next bytes;
  then the request is answered 408 and its connection closed (:func:`body_chunks`, used where
  each process reads a body). A client that declares a body and sends it slowly or never holds
  its call no longer than this between two reads.

The clocks run only while no request is being handled: a response that streams for an hour is
never cut by them (``--max-request-duration`` bounds that). One sweep per listener, every
``SWEEP_S`` seconds at most (sooner for short limits), enforces both timeouts, so a close comes
within one sweep. Every close is counted by reason through ``on_close``; the first of each
reason on a listener is logged, the rest only counted.

Every response, aiohttp's own error answers included, names the server ``server_header`` (the
process, no implementation or version) instead of aiohttp's ``Python/x aiohttp/y``.

Built on aiohttp's low-level server (its per-connection ``RequestHandler`` and the server that
tracks them); aiohttp's own keep-alive timer is set past ours, a backstop that never fires first.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import Counter

log = logging.getLogger("hangup.connections")

SWEEP_S = 1.0


class CloseReason(enum.StrEnum):
    HEADER_TIMEOUT = "header_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    BODY_TIMEOUT = "body_timeout"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 30.0
    idle_timeout: float = 75.0
    max_connections: int = 4096
    body_timeout: float = 60.0


class BodyStalled(Exception):
    """No bytes of a request body arrived for ``body_timeout`` seconds."""


OnClose = Callable[[CloseReason], None]


def counted_in(counter: Counter, listener: str) -> OnClose:
    """Count each close in ``counter`` (labels ``listener``, ``reason``)."""
    return lambda reason: counter.labels(listener, reason.value).inc()


class ClosesNoted:
    """Called with a reason for each connection a listener closed for a limit: counts it
    (``on_close``) and logs the first of each reason, the rest only counted."""

    def __init__(self, on_close: OnClose, listener: str) -> None:
        self._on_close = on_close
        self._listener = listener
        self._logged: set[CloseReason] = set()

    def __call__(self, reason: CloseReason) -> None:
        self._on_close(reason)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "closed a client connection: %s (further ones are only counted)",
                reason.value,
                extra={"fields": {"listener": self._listener, "reason": reason.value}},
            )


class _Handler(web.RequestHandler):
    """aiohttp's connection handler with the two clocks the sweep reads."""

    quiet_since = 0.0  # opened, a request head completed, or last seen handling a request
    head_started = 0.0  # the first byte of the request head still arriving
    partial = False  # bytes of a request head have arrived, the head is not complete
    server_header = ""
    limited: LimitedServer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.quiet_since = asyncio.get_running_loop().time()
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.busy():
            super().data_received(data)
            return
        now = asyncio.get_running_loop().time()
        if not self.partial:
            self.head_started = now
        before = self._request_count
        super().data_received(data)
        self.partial = self._request_count == before
        if not self.partial:
            self.quiet_since = now  # a request begins: idle time counts again after it

    def busy(self) -> bool:
        return bool(self._request_in_progress or self._messages)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp logs a request it could not parse as an error with a traceback; it is the
        client's (answered 400), so one warning line naming it, as the proxy's server writes."""
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            peer = self.transport.get_extra_info("peername") if self.transport else None
            where = peer[0] if isinstance(peer, tuple) else "?"
            log.warning(
                "bad request from %s: %s", where, _one_line(exc.message) or type(exc).__name__
            )
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer to a request aiohttp could not parse (or a handler that failed), as JSON
        in the OpenAI error shape every other error of the server has (aiohttp writes plain
        text), under our ``Server`` name; the connection closes after it.

        A handler that failed only because its client left while it wrote (the transport is
        closing) is not an error of the server's: the request ended as a disconnect, and there
        is nobody to answer. aiohttp would log each as "Error handling request" with a
        traceback; this ends the connection as its own premature-disconnect path does."""
        transport = self.transport
        if isinstance(exc, ConnectionResetError) and (transport is None or transport.is_closing()):
            raise ConnectionError("the client left while its answer was written") from exc
        plain = super().handle_error(request, status, exc, message)  # logs; refuses if sent
        if isinstance(exc, HttpProcessingError):
            what = _one_line(exc.message) or type(exc).__name__
        else:
            what = _one_line(plain.text if isinstance(plain, web.Response) else None)
        kind = "invalid_request_error" if status < 500 else "server_error"
        error = {"message": what or HTTPStatus(status).phrase, "type": kind, "param": None,
                 "code": status}  # fmt: skip
        response = web.json_response({"error": error}, status=status)
        response.headers["Server"] = self.server_header
        response.force_close()
        return response


def _one_line(text: str | None) -> str:
    """aiohttp's multi-line error message on one line."""
    return " ".join(line.strip() for line in (text or "").splitlines() if line.strip())


class LimitedServer(web.Server):
    """aiohttp's low-level server, holding each client connection to ``limits``."""

    def __init__(
        self,
        handler: Any,
        *,
        limits: ConnectionLimits,
        on_close: OnClose,
        listener: str,
        server_header: str,
        **kwargs: Any,
    ) -> None:
        self.server_header = server_header
        # aiohttp's own idle timer stays as a backstop only: ours fire first and are counted.
        longest = max(limits.header_timeout, limits.idle_timeout)
        kwargs["keepalive_timeout"] = longest + 4 * SWEEP_S if longest else 3630.0
        super().__init__(handler, **kwargs)
        self.limits = limits
        self.note = ClosesNoted(on_close, listener)  # count a close, log the first of a reason
        self._sweeping: asyncio.TimerHandle | None = None
        shortest = min(t for t in (limits.header_timeout, limits.idle_timeout, SWEEP_S * 4) if t)
        self._sweep_every = shortest / 4
        self.open = 0  # client connections open now (aiohttp forgets a lost one only later)
        self.on_open_changed: Callable[[], None] = lambda: None  # a shared listener's board

    def __call__(self) -> web.RequestHandler:
        if self._sweeping is None:
            self._sweeping = self._loop.call_later(self._sweep_every, self._sweep)
        handler = _Handler(self, loop=self._loop, **self._kwargs)
        handler.server_header = self.server_header
        handler.limited = self
        return handler

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open += 1
        self.on_open_changed()
        cap = self.limits.max_connections
        if cap and len(self._connections) > cap:
            self._close(handler, CloseReason.TOO_MANY_CONNECTIONS)

    def connection_lost(
        self, handler: web.RequestHandler, exc: BaseException | None = None
    ) -> None:
        super().connection_lost(handler, exc)
        self.open -= 1
        self.on_open_changed()

    def _sweep(self) -> None:
        now = self._loop.time()
        limits = self.limits
        for handler in list(self._connections):
            if not isinstance(handler, _Handler):
                continue
            if handler.busy():
                handler.quiet_since, handler.partial = now, False
                continue
            if handler.partial:
                if limits.header_timeout and now - handler.head_started > limits.header_timeout:
                    self._close(handler, CloseReason.HEADER_TIMEOUT)
            elif limits.idle_timeout and now - handler.quiet_since > limits.idle_timeout:
                self._close(handler, CloseReason.IDLE_TIMEOUT)
        self._sweeping = self._loop.call_later(self._sweep_every, self._sweep)

    def _close(self, handler: web.RequestHandler, reason: CloseReason) -> None:
        handler.force_close()
        transport = self._connections.get(handler)
        if transport is not None:
            transport.close()
        self.note(reason)

    def pre_shutdown(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
        super().pre_shutdown()


async def body_chunks(request: web.BaseRequest, stall_limit: float) -> AsyncIterator[bytes]:
    """An aiohttp ``request``'s body as it arrives (:func:`chunks_until_stalled`)."""

    def stalled() -> None:
        handler = request.protocol
        if isinstance(handler, _Handler) and handler.limited is not None:
            handler.limited.note(CloseReason.BODY_TIMEOUT)

    async for chunk in chunks_until_stalled(request.content.readany, stall_limit, stalled):
        yield chunk


async def chunks_until_stalled(
    readany: Callable[[], Awaitable[bytes]], stall_limit: float, stalled: Callable[[], None]
) -> AsyncIterator[bytes]:
    """A body as ``readany`` reads it (``b""`` at its end). Raises BodyStalled when no byte of
    it comes for ``stall_limit`` seconds (0: wait for ever), after calling ``stalled`` (which
    counts the connection as closed for ``body_timeout``: the caller answers 408 and closes
    it)."""
    while True:
        try:
            async with asyncio.timeout(stall_limit or None):
                chunk = await readany()
        except TimeoutError:
            stalled()
            raise BodyStalled(
                f"no bytes of the request body arrived for {stall_limit:g} s"
            ) from None
        if not chunk:
            return
        yield chunk


class LimitedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose server holds connections to ``limits`` and names itself
    ``server_header`` in every response (not aiohttp's name and version)."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits,
        on_close: OnClose,
        listener: str,
        server_header: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._limits, self._on_close_cb, self._listener = limits, on_close, listener
        self._server_header = server_header

        async def name_the_server(_: web.Request, response: web.StreamResponse) -> None:
            response.headers["Server"] = server_header

        app.on_response_prepare.append(name_the_server)

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return LimitedServer(
            _refusing_versions(plain.request_handler, self._server_header),
            request_factory=_versions_noted(plain.request_factory),
            handler_cancellation=plain.handler_cancellation,
            limits=self._limits,
            on_close=self._on_close_cb,
            listener=self._listener,
            server_header=self._server_header,
            **plain._kwargs,
        )


_VERSIONS = (HttpVersion10, HttpVersion11)
_REFUSED_VERSION = "hangup.refused_version"


def _versions_noted(factory: Any) -> Any:
    """aiohttp takes request lines of any version (``HTTP/2.0``, or none: HTTP/0.9) and answers
    in that version: a status line an HTTP/1.1 client cannot read. A request of another version
    than 1.0 and 1.1 is made as HTTP/1.1 that closes its connection, with its version noted for
    :func:`_refusing_versions` to answer 505."""

    def make(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
        if message.version in _VERSIONS:
            return factory(message, payload, protocol, writer, task)
        as_sent = message.version
        message = message._replace(version=HttpVersion11, should_close=True)
        request = factory(message, payload, protocol, writer, task)
        request[_REFUSED_VERSION] = as_sent
        return request

    return make


def _refusing_versions(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], server_header: str
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        version = request.get(_REFUSED_VERSION)
        if version is None:
            return await handler(request)
        message = f"HTTP version {version[0]}.{version[1]} is not supported: HTTP/1.1 or HTTP/1.0"
        error = {"message": message, "type": "invalid_request_error", "param": None,
                 "code": 505}  # fmt: skip
        response = web.json_response({"error": error}, status=505)
        response.headers["Server"] = server_header
        response.force_close()
        return response

    return handle


def grpc_server_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """The same bounds for a gRPC listener, as gRPC core options: the HTTP/2 handshake must end
    within ``header_timeout``, and a connection with no call for ``idle_timeout`` is closed.
    A cap on connections (gRPC core's ``grpc.max_allowed_incoming_connections``, whose closes
    no process can count) and on calls are each process's own (the gateway's: its gRPC
    server)."""
    options = []
    if limits.header_timeout:
        options.append(("grpc.server_handshake_timeout_ms", int(limits.header_timeout * 1000)))
    if limits.idle_timeout:
        options.append(("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)))
    return options
