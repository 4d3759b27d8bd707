"""The proxy's HTTP/1.1 client: keep-alive connections to one server, for relayed calls and for
cancel calls alike (each user has its own instance, so its own pool).

How a call goes: :meth:`Client.request` takes an idle connection (or opens one), writes the
request at once and awaits the answer's head; :meth:`Client.send_now` writes it on an idle
connection before it returns (no turn of the event loop: a hang-up's cancel leaves in the
callback that saw the hang-up) or says there is none; :meth:`Client.start` (the relay's) writes
it too and returns an :class:`UpstreamCall`, whose head the caller awaits with nothing between it
and the connection, and which goes on, whatever happens to the caller, until it is closed. The
answer's body then goes to a sink as it arrives, or is read whole
(:class:`proxy.upstream.connection.Response`).

The pool. Idle connections are reused last in, first out, at most ``max_idle``; one the server
closes leaves the pool at once (the connection sees the close); with ``idle_ttl`` set, one idle
longer is closed instead of reused (the relay's 60 s: shorter than the gateway's 75 s idle
timeout, so the proxy closes first). A request on a reused connection that ends before any byte
of its answer (``StaleConnection``: the server closed it as the request went out, and has not
seen it) is sent again once on a fresh connection when its body can be (none, or bytes).
``keep_spare``: once it has made a call, the client keeps one connection open and idle (servers
close idle ones: uvicorn after 5 s), opened in the background when the last one closes, at most
once a second, so a hang-up does not wait for a connect.

Errors are the proxy's own (``proxy.errors``), with messages that name the server:
``UpstreamTimeout`` (no connection within the connect timeout), ``UpstreamUnavailable``
(refused, unreachable, TLS: the request was never sent), ``UpstreamBroken`` (the connection
ended early, the answer could not be read, or the request body failed: then ``__cause__`` is
what the body raised). A header value with a line break is a ``ValueError``, raised before
anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.errors import StaleConnection, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.connection import Connection, Response
from proxy.upstream.framing import Body, request_head

log = logging.getLogger("hangup.proxy.upstream")

_SPARE_EVERY = 1.0  # seconds between two spare connections opened (a server that closes at once)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a client's calls go: ``http(s)://host[:port][/prefix]``."""

    host: str
    port: int
    tls: bool
    netloc: str
    prefix: str

    @property
    def name(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.netloc}"

    @classmethod
    def parse(cls, url: str, what: str = "upstream") -> Origin:
        """Raises ``ValueError`` naming ``what`` the URL was for."""
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"{what} URL must be http(s)://host[:port][/path]: {url!r}")
        tls = parts.scheme == "https"
        return cls(
            parts.hostname, parts.port or (443 if tls else 80), tls, parts.netloc, parts.path
        )


class UpstreamCall:
    """A request :meth:`Client.start` sent: ``head`` is the future of its answer's head, for the
    caller to await directly (cancelling it, as cancelling the awaiting task does, leaves the
    call open); :meth:`close` ends the call. A reused connection that turns out closed before
    any byte of the answer is replaced and the request sent again, once, unless ``head`` was
    cancelled by then (the caller is ending the call: nothing is sent for it any more)."""

    __slots__ = ("_body", "_client", "_connection", "_method", "_request", "_task", "head")

    def __init__(self, client: Client, request: bytes, body: bytes | None, method: str) -> None:
        self.head: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._client, self._request, self._body, self._method = client, request, body, method
        self._connection: Connection | None = None
        self._task: asyncio.Task[Response] | None = None

    def sent_on(self, connection: Connection) -> None:
        """Written on ``connection``, which resolves ``head`` (raises ``StaleConnection``)."""
        connection.send(
            self._request,
            self._body,
            False,
            head_only=self._method == "HEAD",
            answer=self.head,
            on_stale=self.resend,
        )
        self._connection = connection

    def resend(self) -> None:
        """The connection closed before answering: send again on a fresh one (a task)."""
        if self._connection is not None:
            self._connection.abandon()
            self._connection = None
        if not self.head.done():
            self.follow(self._client.send_fresh(self._request, self._body, self._method))

    def follow(self, task: asyncio.Task[Response]) -> None:
        """``head`` is what ``task`` returns (a connect, a resend, a streamed body's request)."""
        self._task = task
        task.add_done_callback(self._delivered)

    def _delivered(self, task: asyncio.Task[Response]) -> None:
        head = self.head
        if task.cancelled():
            head.cancel()
            return
        error = task.exception()
        if head.done():
            return
        if error is not None:
            head.set_exception(error)
            head.exception()  # retrieved: the caller may have stopped waiting
        else:
            head.set_result(task.result())

    def abort(self, error: BaseException) -> None:
        """End the call for whoever awaits ``head``: it fails with ``error`` unless it came (so
        nothing is sent again for it), then :meth:`close`."""
        if not self.head.done():
            self.head.set_exception(error)
        self.close()

    def close(self) -> None:
        """Drop the call: its answer closed, unless it was released (its connection reused);
        a connection still waiting for a head, or being opened, dropped."""
        task, head = self._task, self.head
        if task is not None and not task.done():
            task.cancel()
        if head.done() and not head.cancelled() and head.exception() is None:
            head.result().close()
        elif self._connection is not None:
            self._connection.abandon()
        elif task is not None and task.done() and not task.cancelled() and not task.exception():
            task.result().close()  # a head that came after the caller stopped waiting


class Client:
    """Keep-alive HTTP/1.1 connections to one origin (the pool rules in the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        max_idle: int = 1024,
        idle_ttl: float | None = 60.0,
        keep_spare: bool = False,
        what: str = "upstream",
    ) -> None:
        self.origin = Origin.parse(base_url, what)
        self.name = self.origin.name
        self._tls = ssl.create_default_context() if self.origin.tls else None
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle_ttl = idle_ttl
        self._keep_spare = keep_spare
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._used = False
        self._closed = False
        self._spare: asyncio.Task[None] | None = None
        self._spare_at = -_SPARE_EVERY

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: Body
    ) -> Response:
        """Send one request; return once the answer's head has arrived.

        ``target`` is the path and query (the URL's prefix goes before it). Raises
        ``UpstreamError``s; cancelling drops the connection.
        """
        head, chunked = request_head(
            method, self.origin.prefix + target, self.origin.netloc, headers, body
        )
        self._used = True
        connection = self._take()
        reused = connection is not None
        if connection is None:
            connection = await self._connect()
        return await self._answer(connection, head, body, chunked, method, reused=reused)

    def start(
        self, method: str, target: str, headers: list[tuple[str, str]], body: Body
    ) -> UpstreamCall:
        """:meth:`request` as an :class:`UpstreamCall`, whose head the caller awaits directly
        and which goes on until it is closed, whatever happens to the caller. A body of bytes or
        none is written now on an idle connection, and the connection resolves the head (no
        task, no future between them; a stale connection's resend runs in a task); otherwise
        :meth:`request` runs in a task. Raises ``ValueError`` for a header value with a line
        break, before anything is sent."""
        head, _ = request_head(
            method, self.origin.prefix + target, self.origin.netloc, headers, body
        )
        self._used = True
        if not isinstance(body, bytes) and body is not None:
            call = UpstreamCall(self, head, None, method)
            call.follow(asyncio.ensure_future(self.request(method, target, headers, body)))
            return call
        call = UpstreamCall(self, head, body, method)
        connection = self._take()
        if connection is None:
            call.follow(self.send_fresh(head, body, method))
            return call
        try:
            call.sent_on(connection)
        except StaleConnection:
            connection.abandon()
            call.resend()
        return call

    def send_fresh(self, head: bytes, body: bytes | None, method: str) -> asyncio.Task[Response]:
        """Send ``head`` and ``body`` on a new connection, in a task."""
        return asyncio.ensure_future(self._resent(head, body, method))

    async def _resent(self, head: bytes, body: bytes | None, method: str) -> Response:
        connection = await self._connect()
        return await self._answer(connection, head, body, False, method, reused=False)

    def send_now(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> Awaitable[Response] | None:
        """Write one request now on an idle connection; await the result for the answer's head
        (resent once on a fresh connection if that one turns out closed). None when no
        connection is idle: then :meth:`request`."""
        self._used = True
        connection = self._take()
        if connection is None:
            return None
        head, _ = request_head(
            method, self.origin.prefix + target, self.origin.netloc, headers, body
        )
        try:
            sent = connection.send(head, body, False, head_only=method == "HEAD")
        except StaleConnection:
            connection.abandon()
            return None
        return self._answered(connection, sent, head, body, method, reused=True)

    async def close(self) -> None:
        """Drop every connection, idle or busy, and open no more spares."""
        self._closed = True
        if self._spare is not None:
            self._spare.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spare
        for connection in list(self._open):
            connection.abandon()
        self._idle.clear()

    async def _answer(
        self,
        connection: Connection,
        head: bytes,
        body: Body,
        chunked: bool,
        method: str,
        *,
        reused: bool,
    ) -> Response:
        try:
            sent = connection.send(head, body, chunked, head_only=method == "HEAD")
        except BaseException:
            connection.abandon()
            raise
        return await self._answered(connection, sent, head, body, method, reused=reused)

    async def _answered(
        self,
        connection: Connection,
        sent: asyncio.Future[Response],
        head: bytes,
        body: Body,
        method: str,
        *,
        reused: bool,
    ) -> Response:
        try:
            return await sent
        except StaleConnection:
            connection.abandon()
            if not reused or not isinstance(body, bytes | None):
                raise
        except BaseException:
            connection.abandon()
            raise
        fresh = await self._connect()  # once: a fresh connection is not stale
        return await self._answer(fresh, head, body, False, method, reused=False)

    def _take(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if self._idle_ttl is None or now - connection.idle_since < self._idle_ttl:
                return connection
            connection.abandon()
        return None

    def put(self, connection: Connection) -> None:
        """``connection`` finished an exchange and can take another."""
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        if len(self._idle) > self._max_idle:
            self._idle.pop(0).abandon()

    def gone(self, connection: Connection) -> None:
        self._open.discard(connection)
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)
        self._keep_warm()

    def _keep_warm(self) -> None:
        """With ``keep_spare``: open a connection in the background when none is idle."""
        if not self._keep_spare or self._closed or not self._used or self._idle:
            return
        if self._spare is not None and not self._spare.done():
            return
        delay = max(0.0, self._spare_at + _SPARE_EVERY - time.monotonic())
        self._spare = asyncio.get_running_loop().create_task(self._open_spare(delay))

    async def _open_spare(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._idle or self._closed:
            return
        self._spare_at = time.monotonic()
        try:
            connection = await self._connect()
        except UpstreamError as exc:
            log.debug("no spare connection to %s: %s", self.name, exc)
            return
        if self._closed:
            connection.abandon()
        else:
            self.put(connection)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        origin = self.origin
        server_hostname = origin.host if self._tls else None
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: Connection(self),
                    origin.host,
                    origin.port,
                    ssl=self._tls,
                    server_hostname=server_hostname,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.name} did not answer in time") from exc
        except OSError as exc:
            why = str(exc) or type(exc).__name__
            raise UpstreamUnavailable(f"upstream {self.name} is unavailable: {why}") from exc
        self._open.add(connection)
        return connection
