"""Cancel adapters whose cancel is one HTTP POST, on connections of their own; and the hangup one.

``HttpCancelAdapter`` holds what every such adapter shares: HTTP/1.1 keep-alive connections that
no relayed call uses, the first attempt written in the callback that saw the hang-up, a stale
connection replaced once, a spare connection kept ready. An adapter says which POST cancels an id
and what an answer means. ``HangupCancelAdapter`` speaks the cancel contract:
``POST {base}/v2/requests/{id}/cancel`` with ``{"reason"}`` (``hangup_contract.cancel``); the
adapters for other servers are in ``proxy.cancel.servers``. ``h11`` frames the request and parses
the answer (status line, headers, a body framed by Content-Length, chunked encoding or the end of
the connection; interim 1xx answers skipped); this module does the I/O around it.

Why not a general client: aiohttp's client, on Python 3.11, writes a request from a task of its
own, and the canceller's task is another; each task is a turn of the event loop, queued behind
every relay callback that became ready meanwhile (a whole engine step's token fan-out at high
concurrency). ``h11.Connection.send`` returns bytes, so the request for a hang-up is written on
an open connection in the callback that saw the hang-up (asyncio sets TCP_NODELAY).

A connection that ends before any byte of the answer raises ``StaleConnection`` (a reused
keep-alive connection the server had closed: the attempt resends on a fresh one); an answer
``h11`` cannot read raises ``BadResponse``. Both are ``CancelAttemptFailed``: retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from hangup_contract import cancel as contract
from hangup_contract.vocabulary import CancelState, Reason
from proxy.errors import BadResponse, CancelAttemptFailed, StaleConnection
from proxy.vocabulary import CancelResult

log = logging.getLogger("hangup.proxy.cancel")

MAX_BODY = 1024 * 1024  # bytes of answer body accepted (a cancel answer is a small JSON object)
_READ_SIZE = 64 * 1024
_MAX_IDLE = 16  # idle keep-alive connections an adapter keeps for its next cancel calls
_TEND_EVERY = 1.0  # seconds between checks that an idle connection is ready (see _tend)


@dataclass(frozen=True)
class Endpoint:
    """Where cancel calls go: ``http(s)://host[:port][/prefix]``."""

    host: str
    port: int
    tls: bool
    netloc: str
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> Endpoint:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"cancel URL must be http(s)://host[:port][/path]: {base_url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, parts.netloc, parts.path)


@dataclass(frozen=True)
class _Request:
    head: h11.Request
    body: bytes


class Connection:
    """One keep-alive connection to the cancel endpoint, with its HTTP/1.1 state machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._h11 = h11.Connection(h11.CLIENT)

    def usable(self) -> bool:
        """Open, between answers, and not ended by the server (as far as this side has read)."""
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and self._h11.our_state is h11.IDLE
        )

    def send(self, request: _Request) -> None:
        """Write ``request`` now (no await: the bytes leave in the calling callback)."""
        data = self._h11.send(request.head) or b""
        data += self._h11.send(h11.Data(data=request.body)) or b""
        data += self._h11.send(h11.EndOfMessage()) or b""
        self.writer.write(data)

    async def read_response(self) -> tuple[int, str, bool]:
        """The answer: (status, body text, whether the connection may be reused)."""
        status, body, received = 0, bytearray(), False
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise BadResponse(f"unreadable answer: {exc}") from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(_READ_SIZE)
                except ConnectionError as exc:  # reset, broken pipe: the server had closed it
                    if not received:
                        raise StaleConnection(f"connection lost before the answer: {exc}") from exc
                    raise BadResponse(f"connection lost inside the answer: {exc}") from exc
                if not data and not received:
                    raise StaleConnection("connection closed before the answer")
                received = received or bool(data)
                self._h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise BadResponse("answer body too long")
            elif isinstance(event, h11.EndOfMessage):
                return status, body.decode("utf-8", errors="replace"), self._next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                raise BadResponse("connection closed inside the answer")
            # h11.InformationalResponse (1xx): the real answer follows

    def _next_cycle(self) -> bool:
        """Ready the connection for another request; False when it cannot be reused."""
        try:
            self._h11.start_next_cycle()
        except h11.LocalProtocolError:
            return False  # the server closes it (Connection: close, HTTP/1.0, EOF-framed body)
        return True


class HttpCancelAdapter:
    """An adapter whose cancel is one ``POST`` with a JSON body, over connections of its own.

    It speaks HTTP/1.1 itself over keep-alive connections of its own (cancel calls never queue
    behind the relay's connections), because a general client costs event-loop turns before the
    request leaves: ``send_now`` writes the request on an idle connection before it returns, in
    the same callback that saw the hang-up. A reused connection the server had already closed
    is replaced once within the attempt (cancelling is idempotent). Once it has made a call, it
    keeps one connection ready: servers close idle ones (uvicorn after 5 s), and a hang-up that
    finds none waits for a connect.

    Subclasses name themselves and say which call cancels an id (``_call``) and what an answer
    means (``_result``).
    """

    name = "http"
    calls_upstream = True

    def __init__(self, base_url: str, token: str | None, attempt_timeout: float) -> None:
        self._endpoint = Endpoint.parse(base_url)
        # As bytes: h11 validates bytes faster than str (this runs before a hang-up's bytes leave).
        headers = [
            (b"Host", self._endpoint.netloc.encode()),
            (b"Content-Type", b"application/json"),
        ]
        if token:
            if any(c in token for c in "\r\n"):
                raise ValueError("the cancel token must be one line")
            headers.append((b"Authorization", f"Bearer {token}".encode()))
        self._headers = headers
        self._timeout = attempt_timeout
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._tending: asyncio.TimerHandle | None = None
        self._spare: asyncio.Task[None] | None = None
        self._closed = False

    def _call(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        """The path (below the endpoint's prefix) and JSON body that cancel ``request_id``."""
        raise NotImplementedError

    def _result(self, status: int, text: str) -> CancelResult:
        """What an answer means; raises ``CancelAttemptFailed`` when retrying may help."""
        raise NotImplementedError

    def send_now(self, request_id: str, reason: Reason) -> asyncio.Task[CancelResult] | None:
        """Write the cancel request now on an idle connection; the task reads the answer.

        None when no connection is idle (``cancel`` then opens one).
        """
        conn = self._take_idle()
        if conn is None:
            return None
        request = self._request(request_id, reason)
        conn.send(request)
        return asyncio.get_running_loop().create_task(self._answer(conn, request, reused=True))

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        request = self._request(request_id, reason)
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        conn.send(request)
        return await self._answer(conn, request, reused=reused)

    def _request(self, request_id: str, reason: Reason) -> _Request:
        path, body = self._call(request_id, reason)
        path = self._endpoint.prefix + path
        headers = [*self._headers, (b"Content-Length", str(len(body)).encode())]
        return _Request(h11.Request(method=b"POST", target=path.encode(), headers=headers), body)

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            self._discard(conn)
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self._timeout):
                reader, writer = await asyncio.open_connection(
                    self._endpoint.host, self._endpoint.port, ssl=self._endpoint.tls
                )
        except (TimeoutError, OSError) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        conn = Connection(reader, writer)
        self._open.add(conn)
        return conn

    async def _answer(self, conn: Connection, request: _Request, *, reused: bool) -> CancelResult:
        """Read the answer to ``request`` (written on ``conn``) within the attempt's time."""
        keep = False
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    status, text, keep = await conn.read_response()
                except StaleConnection:
                    if not reused:
                        raise
                    self._discard(conn)
                    conn = await self._connect()
                    conn.send(request)
                    status, text, keep = await conn.read_response()
        except (TimeoutError, OSError, StaleConnection, BadResponse) as exc:
            raise CancelAttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if keep:
                self._idle.append(conn)
                if len(self._idle) > _MAX_IDLE:
                    self._discard(self._idle.pop(0))
            else:
                self._discard(conn)
            if self._tending is None and not self._closed:
                self._tend()
        return self._result(status, text)

    def _tend(self) -> None:
        """Every ``_TEND_EVERY`` seconds: drop idle connections the server closed, and open one
        in the background when none is left."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        self._tending = loop.call_later(_TEND_EVERY, self._tend)
        for conn in [c for c in self._idle if not c.usable()]:
            self._idle.remove(conn)
            self._discard(conn)
        if not self._idle and (self._spare is None or self._spare.done()):
            self._spare = loop.create_task(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            self._idle.append(await self._connect())
        except CancelAttemptFailed as exc:
            log.debug("no spare cancel connection: %s", exc)

    def _discard(self, conn: Connection) -> None:
        self._open.discard(conn)
        conn.writer.close()

    async def close(self) -> None:
        self._closed = True
        if self._tending is not None:
            self._tending.cancel()
        if self._spare is not None:
            self._spare.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spare
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()


class HangupCancelAdapter(HttpCancelAdapter):
    """The cancel contract's HTTP call: ``POST {base}/v2/requests/{id}/cancel`` with ``{"reason"}``.

    200 ``cancelled`` → ok, 200 ``finished`` → finished, 404 → not_found, other 4xx → error
    (retrying cannot fix a bad token); 5xx, 429, refused or timed-out connections are retried.
    """

    name = "hangup"

    def _call(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        return contract.cancel_path(request_id), contract.encode_request(reason)

    def _result(self, status: int, text: str) -> CancelResult:
        if status == 404:
            return CancelResult.NOT_FOUND
        if status == 429 or status >= 500:
            raise CancelAttemptFailed(f"cancel endpoint answered {status}")
        if status != 200:
            log.warning("cancel refused with %d: %s", status, text[:200])
            return CancelResult.ERROR
        try:
            answer = contract.CancelAnswer.from_json(text)
        except ValueError as exc:
            log.warning("cancel answered 200 but %s: %s", exc, text[:200])
            return CancelResult.ERROR
        return CancelResult.FINISHED if answer.state is CancelState.FINISHED else CancelResult.OK
