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

from bench.harness.raw_http import RawServer


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
        self._server = RawServer(self._relay)
        self.address = ""

    async def __aenter__(self) -> NaiveRelay:
        await self._server.__aenter__()
        self.address = f"127.0.0.1:{self._server.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.__aexit__(*exc)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        self._server.hold(up_writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_length(head))
                up_writer.write(head + body)
                answer = await up_reader.readuntil(b"\r\n\r\n")
                writer.write(answer + await up_reader.readexactly(_length(answer)))
        finally:
            up_writer.close()
