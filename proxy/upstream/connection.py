"""One HTTP/1.1 connection of the proxy's client, its parser, and the answer it reads.

Why not a general client (aiohttp's did this job before): its response body is a stream that a
coroutine reads, so every event the upstream writes costs a future, a task step and an async
generator turn before it is written on; and its request is written from a task of its own, a
turn of the event loop after the caller asked. Here the request is written in the caller's own
callback (:meth:`Connection.send` returns the future of the answer's head), and the parser
(``httptools``: llhttp, in C) calls back with each body chunk, handed to the answer's
:class:`Sink` in that same callback, so no task runs per event. The caller's task wakes only
when the body ends, the upstream breaks off, or the sink is full; then reading from the upstream
stops until the sink has drained (back-pressure reaches the upstream as TCP flow control).

One exchange per connection at a time, no pipelining. Framing. Requests: as
:mod:`proxy.upstream.framing` writes their head. Responses: framed
by ``Content-Length``, chunked encoding, or the end of the connection; interim 1xx answers are
skipped; an answer to ``HEAD`` has no body (and its connection is not reused: the parser cannot
be told to expect none). What the upstream must not send is refused (``UpstreamBroken``, the
connection dropped): bytes past the end of an answer (a second answer, a 204's body: they would
be read as the next call's answer), a transfer coding besides ``chunked``, a ``101`` (the proxy
never asks to switch), a head and trailer over 64 KiB. Trailer fields are dropped, never merged
into the head; a 204's ``Content-Length`` is dropped.

A connection that ends before any byte of its answer raises ``StaleConnection`` (the server
closed it as the request went out: :mod:`proxy.upstream.client` resends once); other errors
are ``UpstreamBroken`` naming the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Protocol, cast

import httptools

from proxy.errors import StaleConnection, UpstreamBroken
from proxy.upstream.framing import Body
from proxy.upstream.sink import Sink

_PENDING_LIMIT = 64 * 1024  # body bytes held before a sink is attached (then reading pauses)
_HEAD_LIMIT = 64 * 1024  # an answer's status line and fields (Envoy's default limit is 60 KiB)
_NO_BODY = frozenset({204, 304})


class _Refused(Exception):
    """An answer the connection will not relay (raised in a parser callback: parsing stops)."""


class Pool(Protocol):
    """What a connection tells the client that owns it."""

    @property
    def name(self) -> str:
        """``scheme://host:port``, in error messages."""
        ...

    def put(self, connection: Connection) -> None:
        """``connection`` finished an exchange cleanly and can take another."""

    def gone(self, connection: Connection) -> None:
        """``connection`` is closed (by either side): it leaves the pool."""


class Response:
    """One upstream answer: its head, and its body for :meth:`stream_to` or :meth:`read`."""

    def __init__(
        self, connection: Connection, status: int, reason: str, fields: list[tuple[bytes, bytes]]
    ) -> None:
        self._connection = connection
        self.status = status
        self.reason = reason
        self.fields = fields  # the header fields as they came, order and repeats kept
        self._done = False  # released or closed: the connection is no longer this answer's

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The header fields, decoded."""
        return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.fields]

    def stream_to(self, sink: Sink) -> Coroutine[None, None, None]:
        """Hand the body to ``sink`` as it arrives; the awaitable returns once it has all
        arrived (the connection's own coroutine: no frame of this one between).

        Raises ``UpstreamBroken`` if the upstream breaks off first, and whatever ``sink.drain``
        raises. Cancelling the caller leaves the connection open: :meth:`close` it.
        """
        return self._connection.relay(sink)

    async def read(self, limit: int) -> bytes:
        """The whole body; ``ValueError`` if it is larger than ``limit`` bytes."""
        collected = Collected(limit)
        await self.stream_to(collected)
        return b"".join(collected.chunks)

    def release(self) -> None:
        """Done with this answer: its connection goes back to the pool if it can be reused.
        Once released or closed, neither does anything more (the connection may be serving
        another call by then)."""
        if not self._done:
            self._done = True
            self._connection.finish()

    def close(self) -> None:
        """Drop the connection (the upstream sees it end), unless already released or closed."""
        if not self._done:
            self._done = True
            self._connection.abandon()


class Collected:
    """A sink that keeps a whole body, refusing more than ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self._size, self._limit = 0, limit

    def write(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self._limit:
            self.chunks.append(chunk)

    def flush(self) -> None:
        pass

    def full(self) -> bool:
        return self._size > self._limit

    async def drain(self) -> None:
        raise ValueError(f"the answer is larger than {self._limit} bytes")


class Connection(asyncio.Protocol):
    """One connection and its parser; the state of the exchange in progress."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self.name = pool.name
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._write_ready: asyncio.Future[None] | None = None  # set while writing is paused
        self.idle_since = 0.0
        self._begin(head_only=False)

    def _begin(self, *, head_only: bool) -> None:
        self._head_only = head_only
        self._head: asyncio.Future[Response] | None = None
        self._on_stale: Callable[[], None] | None = None
        self._received = False
        self._status_text = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._framed = False  # a Content-Length or Transfer-Encoding field came
        self._codings: list[bytes] = []  # the Transfer-Encoding values
        self._head_size = 0
        self._delimited_by_close = False
        self._headers_done = False
        self._complete = False
        self._keep_alive = False  # read at the answer's end (the parser forgets it after)
        self._error: BaseException | None = None
        self._sink: Sink | None = None
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._batch: list[bytes] | None = None
        """The body bytes parsed from one upstream read, written to the client as one."""
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._body_task: asyncio.Task[None] | None = None
        self._body_sent = False

    # --- the exchange, driven by the caller ---------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed or self._transport is None

    def send(
        self,
        head: bytes,
        body: Body,
        chunked: bool,
        *,
        head_only: bool,
        answer: asyncio.Future[Response] | None = None,
        on_stale: Callable[[], None] | None = None,
    ) -> asyncio.Future[Response]:
        """Write the request now (a body of bytes with its head, in one write; a streamed body
        from a task of its own); the future (``answer`` when given) is the answer's head.
        Raises ``StaleConnection`` at once when the connection has closed. If it closes before
        any byte of the answer, ``on_stale`` is called instead of failing the future with
        ``StaleConnection`` (the caller resends). A cancelled future leaves the exchange open:
        the caller drops the connection (:meth:`abandon`)."""
        if self._closed or self._transport is None:
            raise StaleConnection(f"upstream {self.name}: the connection had closed")
        self._begin(head_only=head_only)
        if answer is None:
            answer = asyncio.get_running_loop().create_future()
        self._head, self._on_stale = answer, on_stale
        if isinstance(body, bytes) or body is None:
            self._transport.write(head + body if body else head)
            self._body_sent = True
        else:
            self._transport.write(head)
            self._body_task = answer.get_loop().create_task(self._send_body(body, chunked))
        return answer

    async def _send_body(self, body: AsyncIterator[bytes], chunked: bool) -> None:
        try:
            async for chunk in body:
                if not chunk or self._closed:
                    continue
                assert self._transport is not None
                self._transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if self._write_ready is not None:
                    await self._write_ready
            if chunked and not self._closed:
                assert self._transport is not None
                self._transport.write(b"0\r\n\r\n")
            self._body_sent = True
        except Exception as exc:
            error = UpstreamBroken(f"upstream {self.name}: the request body failed: {exc!r}")
            error.__cause__ = exc
            self._fail(error)
            self.abandon()

    async def relay(self, sink: Sink) -> None:
        self._sink = sink
        pending, self._pending, self._pending_size = self._pending, [], 0
        if pending:  # what arrived before the relay began: one write, not one per chunk
            sink.write(pending[0] if len(pending) == 1 else b"".join(pending))
        loop = asyncio.get_running_loop()
        while True:
            if self._error is not None:
                raise self._error
            if self._complete:
                return
            if self._paused or sink.full():
                await sink.drain()
                self._resume()
                continue
            sink.flush()
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def finish(self) -> None:
        """The caller is done: reuse the connection if the exchange ended cleanly."""
        reusable = (
            self._complete
            and self._error is None
            and self._body_sent
            and not self._head_only
            and not self._closed
            and self._keep_alive
        )
        if reusable:
            self._sink, self._head = None, None
            self._resume()
            self._pool.put(self)
        else:
            self.abandon()

    def abandon(self) -> None:
        if self._body_task is not None and not self._body_task.done():
            self._body_task.cancel()
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()
        self._pool.gone(self)

    def _fail(self, error: BaseException) -> None:
        if self._error is not None or self._complete:
            return
        self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved here too: the caller may have been cancelled
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if self._transport is not None and not self._closed:
                self._transport.resume_reading()

    def _pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
            self._wake()

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, but have its interface
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._head is None:  # nothing was asked: the upstream is confused
            self.abandon()
            return
        self._received = True
        self._batch = []
        try:
            self._parser.feed_data(data)
            self._flush()
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._batch = None
            cause = exc.__context__
            why = str(cause) if isinstance(cause, _Refused) else f"what is not HTTP/1.1: {exc}"
            self._fail(UpstreamBroken(f"upstream {self.name} answered {why}"))
            self.abandon()  # an answer that ended before stays whole; the connection goes

    def eof_received(self) -> bool:
        if self._headers_done and self._delimited_by_close:
            self.on_message_complete()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._pool.gone(self)
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        if self._head is not None and not self._complete:
            why = f": {exc}" if exc else ""
            error = UpstreamBroken if self._received else StaleConnection
            stale, self._on_stale = self._on_stale, None
            if stale is not None and error is StaleConnection and self._error is None:
                self._error = StaleConnection(f"upstream {self.name} closed{why}")
                stale()  # the caller resends: its future is not this connection's to fail
                return
            self._fail(error(f"upstream {self.name} broke off before answering in full{why}"))

    def pause_writing(self) -> None:
        self._write_ready = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None

    # --- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._headers_done:  # a second answer to one request: the upstream is confused
            raise _Refused("bytes past the end of its answer")

    def on_status(self, status: bytes) -> None:
        self._status_text += status
        self._count(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:  # a trailer field: never one of the head's (RFC 9110 6.5.1)
            self._count(len(name) + len(value))
            return
        self._count(len(name) + len(value))
        size = len(name)
        if size == 14 and name.lower() == b"content-length":
            self._framed = True
        elif size == 17 and name.lower() == b"transfer-encoding":
            self._framed = True
            self._codings.append(value)
        self._fields.append((name, value))

    def _count(self, size: int) -> None:
        self._head_size += size
        if self._head_size > _HEAD_LIMIT:
            raise _Refused(f"an answer head (with its trailer) over {_HEAD_LIMIT} bytes")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # interim: the real answer follows
            self._status_text, self._fields, self._framed = b"", [], False
            self._codings, self._head_size = [], 0
            return
        if status == 101:  # the proxy never relays an Upgrade: nothing asked for a switch
            raise _Refused("a switch of protocols (101) that no request asked for")
        codings = self._codings
        if codings and (len(codings) > 1 or codings[0].strip().lower() != b"chunked"):
            # the chunks are decoded and the body relayed: a coding besides would reach the
            # client unsaid
            shown = b", ".join(codings).decode("latin-1")
            raise _Refused(f"transfer coding {shown!r}: only chunked is relayed")
        self._headers_done = True
        no_body = self._head_only or status in _NO_BODY
        self._delimited_by_close = not self._framed and not no_body
        status_text = self._status_text.decode("latin-1")
        if status == 204 and self._framed:  # a 204 has no body, and says no length (RFC 9110)
            self._fields = [(n, v) for n, v in self._fields if n.lower() != b"content-length"]
        response = Response(self, status, status_text, self._fields)
        if no_body:
            self._complete = True
        assert self._head is not None
        if not self._head.done():
            self._head.set_result(response)

    def _flush(self) -> None:
        """Write what this read's chunks carried, in one write: an SSE stream's events that came
        in one read leave in one write (a syscall per event was most of the relay's CPU)."""
        batch, self._batch = self._batch, None
        sink = self._sink
        if batch and sink is not None:
            sink.write(batch[0] if len(batch) == 1 else b"".join(batch))
            if sink.full():
                self._pause()

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        sink = self._sink
        if sink is not None and self._batch is not None:
            self._batch.append(body)
            return
        if sink is None:
            self._pending.append(body)
            self._pending_size += len(body)
            if self._pending_size > _PENDING_LIMIT:
                self._pause()
            return
        sink.write(body)
        if sink.full():
            self._pause()

    def on_message_complete(self) -> None:
        if not self._headers_done or self._complete:
            return
        self._flush()
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()
