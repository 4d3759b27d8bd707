"""Header rules for relaying one HTTP/1.1 call: hop-by-hop fields, forwarding fields, where the
call's ids go (chosen by :mod:`proxy.calls.request_ids`).

No I/O: header lists in, header lists out. Hop-by-hop fields (RFC 9110 §7.6.1: ``Connection`` and
every field it names, plus the classic ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``, ``Proxy-Authenticate``, ``Proxy-Authorization``) describe one
connection and are never relayed; the proxy frames each side's body itself. ``Expect`` is answered
by the proxy and dropped too. Field order and repeated fields are kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from hangup_contract.jobs import GROUP_HEADER
from proxy.calls.request_ids import CLIENT_REQUEST_ID, REQUEST_ID, RequestIds
from proxy.labels import SERVER_HEADER
from proxy.messages import HeadFields

Headers = list[tuple[str, str]]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)
_REQUEST_ID = REQUEST_ID.lower()
_DROP_UPSTREAM = frozenset({"expect", _REQUEST_ID, CLIENT_REQUEST_ID.lower()})
_GROUP = GROUP_HEADER.lower()


class ClientHead(NamedTuple):
    """What one pass over a client request's header fields finds (made for every call)."""

    upstream: Headers  # the fields to send upstream, the call's ids still to add (add_ids)
    request_id: str | None  # the client's own X-Request-Id (the first), dropped from upstream
    expect: str | None  # its Expect (answered by the proxy, never relayed)
    group: str | None  # its X-Hangup-Group (the first; relayed as it came)


def upstream_request_headers(
    headers: Iterable[tuple[str, str]], *, client_addr: str | None, scheme: str
) -> ClientHead:
    """The headers to send upstream for a client request carrying ``headers``, and what the
    proxy reads in them (one pass: this runs for every call)."""
    out: Headers = []
    named: set[str] = set()  # what Connection names, dropped once it is all known
    forwarded_for: str | None = None
    forwarded_proto = False
    request_id = expect = group = None
    for name, value in headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP:
            if lowered == "connection":
                named.update(t.strip().lower() for t in value.split(",") if t.strip())
        elif lowered in _DROP_UPSTREAM:
            if lowered == _REQUEST_ID:
                request_id = value if request_id is None else request_id
            elif lowered == "expect":
                expect = value if expect is None else expect
        elif lowered == "x-forwarded-for" and client_addr:
            if forwarded_for is None:
                forwarded_for = value
        else:
            if lowered == _GROUP:
                group = value if group is None else group
            forwarded_proto = forwarded_proto or lowered == "x-forwarded-proto"
            out.append((name, value))
    if named:
        out = [(n, v) for n, v in out if n.lower() not in named]
        forwarded_for = None if "x-forwarded-for" in named else forwarded_for
        forwarded_proto = forwarded_proto and "x-forwarded-proto" not in named
    if client_addr:
        out.append(
            ("X-Forwarded-For", f"{forwarded_for}, {client_addr}" if forwarded_for else client_addr)
        )
    if not forwarded_proto:
        out.append(("X-Forwarded-Proto", scheme))
    return ClientHead(out, request_id, expect, group)


def add_ids(headers: Headers, ids: RequestIds) -> None:
    """Name the call's ids in ``headers`` going upstream: its own, and the client's when that
    is another."""
    headers.append((REQUEST_ID, ids.upstream))
    if ids.client is not None and ids.client != ids.upstream:
        headers.append((CLIENT_REQUEST_ID, ids.client))


_HOP_BY_HOP_BYTES = frozenset(name.encode() for name in HOP_BY_HOP)
_REPLACED = frozenset({REQUEST_ID.lower().encode(), b"server"})
_ECHOED = f"{REQUEST_ID}: ".encode()
_SERVER = f"Server: {SERVER_HEADER}".encode()


def client_response_head(fields: Iterable[tuple[bytes, bytes]], *, request_id: str) -> HeadFields:
    """The head fields to send the client for an upstream response carrying ``fields`` (as the
    parser gave them: bytes are relayed as they came, one pass: this runs for every call).

    ``Content-Length`` is kept (the body is relayed byte for byte); chunked framing is redone by
    the proxy. The upstream call's id is always echoed as ``X-Request-Id``; ``Server`` names the
    proxy (as Envoy overwrites it by default), so the upstream's implementation is not advertised.
    """
    lines: list[bytes] = []
    named: set[bytes] = set()
    sized = dated = False
    for name, value in fields:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP_BYTES:
            if lowered == b"connection":
                named.update(t.strip().lower() for t in value.split(b",") if t.strip())
        elif lowered not in _REPLACED:
            lines.append(name + b": " + value)
            if lowered == b"content-length":
                sized = True
            elif lowered == b"date":
                dated = True
    if named:
        lines = [line for line in lines if line.partition(b":")[0].lower() not in named]
        sized = sized and b"content-length" not in named
        dated = dated and b"date" not in named
    lines.append(_ECHOED + request_id.encode())
    lines.append(_SERVER)
    return HeadFields(lines, sized, dated)
