"""The proxy's HTTP/1.1 client: keep-alive connections to one server, for relayed calls and for
cancel calls alike (each user has its own instance, so its own pool).

How a call goes: :meth:`Client.request` takes an idle connection (or opens one), writes the
request at once and awaits the answer's head; :meth:`Client.send_now` writes it on an idle
connection before it returns (no turn of the event loop: a hang-up's cancel leaves in the
callback that saw the hang-up) or says there is none. The answer's body then goes to a sink as
it arrives, or is read whole (:class:`proxy.upstream.connection.Response`).

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
from proxy.upstream.connection import Body, Connection, Response, request_head

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


async def outlive(future: asyncio.Future[Response]) -> Response:
    """``future``'s result, awaited so that cancelling the awaiting task leaves ``future`` alone
    (``asyncio.shield``'s guarantee, without its second future and two callbacks a call)."""
    if not future.done():
        waiter = future.get_loop().create_future()

        def wake(_: asyncio.Future[Response]) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        try:
            await waiter
        finally:
            future.remove_done_callback(wake)
    return future.result()


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
    ) -> asyncio.Future[Response]:
        """:meth:`request` as a future that outlives whoever awaits it (:func:`outlive`). A body of
        bytes or none is written now on an idle connection and no task runs for the call (a
        stale connection's resend runs in one); otherwise :meth:`request` runs in a task.
        Cancelling the future drops the connection. Raises ``ValueError`` for a header value
        with a line break, before anything is sent."""
        if not isinstance(body, bytes) and body is not None:
            return asyncio.ensure_future(self.request(method, target, headers, body))
        head, _ = request_head(
            method, self.origin.prefix + target, self.origin.netloc, headers, body
        )
        self._used = True
        connection = self._take()
        if connection is not None:
            try:
                sent = connection.send(head, body, False, head_only=method == "HEAD")
            except StaleConnection:
                connection.abandon()
            else:
                return self._awaiting(connection, sent, head, body, method)
        return asyncio.ensure_future(self._resent(head, body, method))

    def _awaiting(
        self,
        connection: Connection,
        sent: asyncio.Future[Response],
        head: bytes,
        body: bytes | None,
        method: str,
    ) -> asyncio.Future[Response]:
        """The answer to a request written on a reused connection, sent again once on a fresh
        connection if that one turns out closed (as :meth:`_answered`, in callbacks)."""
        result: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        resent: list[asyncio.Task[Response]] = []

        def answered(sent: asyncio.Future[Response]) -> None:
            if result.done():  # cancelled: the connection was dropped then
                return
            error = sent.exception() if not sent.cancelled() else asyncio.CancelledError()
            if error is None:
                result.set_result(sent.result())
                return
            connection.abandon()
            if not isinstance(error, StaleConnection):
                result.set_exception(error)
                return
            task = asyncio.ensure_future(self._resent(head, body, method))
            resent.append(task)
            task.add_done_callback(passed_on)

        def passed_on(task: asyncio.Task[Response]) -> None:
            if result.done():
                return
            if task.cancelled():
                result.cancel()
            elif (error := task.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(task.result())

        def dropped(result: asyncio.Future[Response]) -> None:
            if result.cancelled():
                connection.abandon()
                for task in resent:
                    task.cancel()

        sent.add_done_callback(answered)
        result.add_done_callback(dropped)
        return result

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
