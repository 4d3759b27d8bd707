"""A deliberately naive HTTP/1.1 relay: the framing battery's proof that it can see a smuggle.

It does what a hand-written relay often does: reads a request head up to the blank line, takes
``Content-Length`` as the body's length (and ignores ``Transfer-Encoding``), and forwards the
head and that many bytes as they came, on one upstream connection kept for the client's
connection; each answer is read by its ``Content-Length`` and copied back. An upstream that reads
``Transfer-Encoding`` (as RFC 9112 says it must) then reads a request the relay never framed.
Never use it for anything else.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.recording_upstream import ended


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value.strip())
    return 0


class NaiveRelay:
    """On 127.0.0.1:0, relaying to ``upstream_port`` on 127.0.0.1 (the module docstring)."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.address = ""

    async def __aenter__(self) -> NaiveRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await ended(self._tasks)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        self._writers.append(up_writer)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    body = await reader.readexactly(_length(head))
                    up_writer.write(head + body)
                    answer = await up_reader.readuntil(b"\r\n\r\n")
                    writer.write(answer + await up_reader.readexactly(_length(answer)))
        finally:
            up_writer.close()
            writer.close()
            self._tasks.discard(task)
