"""A raw HTTP/1.1 server for client tests: each connection it accepts runs a script on the bytes.

The proxy's HTTP/1.1 client (``proxy.upstream``) is tested against servers that answer with
exact bytes (every framing, interim answers, answers that are not HTTP, connections closed at
chosen moments), which no real server library can be made to send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server on 127.0.0.1 that runs ``script`` for each connection it accepts; the
    connection is closed when the script returns (or the client ends it)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.port = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._scripts: list[asyncio.Task[None]] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self._scripts.append(task)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.script(reader, writer)
        writer.close()

    def hold(self, writer: asyncio.StreamWriter) -> None:
        """Abort ``writer`` too when the server stops (a connection a script opened itself)."""
        self._writers.append(writer)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            if not writer.is_closing():  # a script still running: end it
                writer.transport.abort()
        await asyncio.gather(*self._scripts, return_exceptions=True)
        await self._server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head and its body (Content-Length or chunked). Raises
    ``asyncio.IncompleteReadError`` when the client closes first."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = {
        line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if b":" in line
    }
    if b"content-length" in fields:
        return head, await reader.readexactly(int(fields[b"content-length"]))
    body = b""
    if fields.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
    return head, body


def ok(body: bytes) -> bytes:
    """A 200 answer carrying ``body``, framed by Content-Length (the connection may be reused)."""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
