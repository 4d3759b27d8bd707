"""Deliberately naive HTTP/1.1 relays: the framing battery's proof that it can see a smuggle.

:class:`NaiveRelay` does what a hand-written relay often does: reads a request head up to the
blank line, takes ``Content-Length`` as the body's length (and ignores ``Transfer-Encoding``),
and forwards the head and that many bytes as they came to the upstream.

- By default it opens an upstream connection for each client connection and reads each answer
  by its ``Content-Length``: an upstream that reads ``Transfer-Encoding`` (as RFC 9112 says it
  must) then reads a request the relay never framed, and a request the relay never ends is left
  half-sent on an upstream connection it never closes.
- ``reuse=True``: one upstream connection kept from one client to the next, as a naive
  keep-alive pool keeps it, and the upstream's bytes copied to whichever client holds it as they
  come, with no framing of the answers: what an upstream writes past its answer reaches the
  client, and what it writes once that client has gone reaches the next.

Never use either for anything else.
"""

from __future__ import annotations

import asyncio
import contextlib

from bench.harness.raw_http import RawServer


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return max(0, int(value.strip()))
    return 0


class _Kept:
    """The upstream connection a reusing relay keeps, and the bytes it read while no client
    held it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.client: asyncio.StreamWriter | None = None
        self.unclaimed = b""
        self.open = True
        self.pump = asyncio.ensure_future(self._pump(reader))

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if self.client is None:
                    self.unclaimed += data
                else:
                    self.client.write(data)
        self.open = False
        if self.client is not None:  # the upstream closed: so does the client's connection
            self.client.close()

    def hold(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        client.write(self.unclaimed)
        self.unclaimed = b""


class NaiveRelay:
    """On 127.0.0.1:0, relaying to ``upstream_port`` on 127.0.0.1 (the module docstring)."""

    def __init__(self, upstream_port: int, *, reuse: bool = False) -> None:
        self._upstream_port = upstream_port
        self._server = RawServer(self._relay_reusing if reuse else self._relay)
        self._kept: _Kept | None = None
        self._turn = asyncio.Lock()  # a reusing relay serves one client at a time
        self.address = ""

    async def __aenter__(self) -> NaiveRelay:
        await self._server.__aenter__()
        self.address = f"127.0.0.1:{self._server.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.__aexit__(*exc)
        if self._kept is not None:
            self._kept.pump.cancel()
            await asyncio.gather(self._kept.pump, return_exceptions=True)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        self._server.hold(writer)
        return reader, writer

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._open()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_length(head))
                up_writer.write(head + body)
                answer = await up_reader.readuntil(b"\r\n\r\n")
                writer.write(answer + await up_reader.readexactly(_length(answer)))
        finally:
            up_writer.close()

    async def _relay_reusing(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async with self._turn:
            if self._kept is None or not self._kept.open:
                self._kept = _Kept(*await self._open())
            kept = self._kept
            kept.hold(writer)
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    kept.writer.write(head + await reader.readexactly(_length(head)))
            finally:
                kept.client = None
