"""A request's head as the proxy's HTTP/1.1 client writes it (no I/O): its own framing, whatever
the caller's fields say.

A body of bytes goes with its own ``Content-Length`` (replacing any the caller gives); a streamed
body with the ``Content-Length`` the caller names, else chunked; a ``Host`` field unless the
caller gives one. ``CONNECT`` is never written: its answer would make the connection a tunnel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

Body = bytes | AsyncIterator[bytes] | None


def request_head(
    method: str, target: str, netloc: str, headers: list[tuple[str, str]], body: Body
) -> tuple[bytes, bool]:
    """The request's head, and whether its body goes chunked. ``ValueError`` for ``CONNECT``
    (the proxy does not tunnel) and for a field with a line break."""
    if method == "CONNECT":
        raise ValueError("CONNECT is never sent: a connection that tunnels cannot be reused")
    lines = [f"{method} {target} HTTP/1.1"]
    sized = isinstance(body, bytes)  # its length is written below, whatever the caller says
    host = length = False
    for name, value in headers:
        size = len(name)  # a name is lowered only when its length is one of the two looked for
        if size == 14 and name.lower() == "content-length":
            if sized:
                continue
            length = True
        elif size == 4 and name.lower() == "host":
            host = True
        lines.append(f"{name}: {value}")
    if not host:
        lines.append(f"Host: {netloc}")
    chunked = body is not None and not sized and not length
    if isinstance(body, bytes):
        lines.append(f"Content-Length: {len(body)}")
    elif chunked:
        lines.append("Transfer-Encoding: chunked")
    elif body is None and method in {"POST", "PUT", "PATCH"} and not length:
        lines.append("Content-Length: 0")
    lines.append("\r\n")
    text = "\r\n".join(lines)
    breaks = len(lines)  # the head's own: one scan each for more, not one per field
    if text.count("\n") != breaks or text.count("\r") != breaks:
        bad = next(line for line in lines[:-1] if "\r" in line or "\n" in line)
        raise ValueError(f"{bad.partition(':')[0][:64]!r}: line breaks are not allowed")
    return text.encode("utf-8", "surrogateescape"), chunked
