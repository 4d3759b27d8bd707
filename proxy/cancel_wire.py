"""The few pieces of HTTP/1.1 the cancel adapter speaks itself: where the endpoint is, one
keep-alive connection to it, and reading one response.

Why not a general client: aiohttp's client, on Python 3.11, writes a request body from a task of
its own, and the canceller's task is another; each task is a turn of the event loop, queued
behind every relay callback that became ready in the meantime (a whole engine step's token
fan-out at high concurrency). Writing a small, fixed request on a connection already open needs
none of that: the bytes leave in the callback that saw the hang-up (asyncio sets TCP_NODELAY).

``read_response`` reads a status line, headers and a body framed by Content-Length, chunked
encoding or the end of the connection; interim 1xx responses are skipped. A connection that
ends before the status line raises ``StaleConnection`` (a reused keep-alive connection the server
had closed: the caller may resend on a fresh one); anything unreadable raises ``BadResponse``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.errors import BadResponse, StaleConnection

MAX_HEAD = 64 * 1024  # bytes of status line and headers accepted
MAX_BODY = 1024 * 1024  # bytes of body accepted (a cancel answer is a small JSON object)


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


@dataclass(eq=False)
class Connection:
    """One keep-alive connection to the cancel endpoint."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        """Open and not ended by the server (as far as this side has read)."""
        return not self.writer.is_closing() and not self.reader.at_eof()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, str, bool]:
    """One response: (status, body text, whether the connection may be reused)."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise StaleConnection("connection closed before the response") from exc
            raise BadResponse("connection closed inside the response head") from exc
        except asyncio.LimitOverrunError as exc:
            raise BadResponse("response head too long") from exc
        except ConnectionError as exc:  # reset, broken pipe: the server had closed it
            raise StaleConnection(f"connection lost before the response: {exc}") from exc
        status, version, headers = _parse_head(head)
        if not 100 <= status < 200:
            break
    body, until_eof = await _read_body(reader, status, headers)
    connection = headers.get("connection", "").lower()
    keep = not until_eof and (
        "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
    )
    return status, body.decode("utf-8", errors="replace"), keep


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise BadResponse(f"bad status line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadResponse(f"bad header line: {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[0], headers


async def _read_body(
    reader: asyncio.StreamReader, status: int, headers: dict[str, str]
) -> tuple[bytes, bool]:
    """The body and whether it ran to the end of the connection."""
    try:
        if status in {204, 304}:
            return b"", False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await _read_chunked(reader), False
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit() or int(length) > MAX_BODY:
                raise BadResponse(f"bad Content-Length: {length[:20]!r}")
            return await reader.readexactly(int(length)), False
        return await reader.read(MAX_BODY), True
    except asyncio.IncompleteReadError as exc:
        raise BadResponse("connection closed inside the response body") from exc
    except asyncio.LimitOverrunError as exc:
        raise BadResponse("chunk header too long") from exc


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError as exc:
            raise BadResponse(f"bad chunk size: {size_line[:20]!r}") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return bytes(body)
        if len(body) + size > MAX_BODY:
            raise BadResponse("response body too long")
        body += await reader.readexactly(size)
        await reader.readexactly(2)
