"""Header rules for relaying one HTTP/1.1 call: hop-by-hop fields, forwarding fields, where the
call's ids go (chosen by :mod:`proxy.request_ids`).

No I/O: header lists in, header lists out. Hop-by-hop fields (RFC 9110 §7.6.1: ``Connection`` and
every field it names, plus the classic ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``, ``Proxy-Authenticate``, ``Proxy-Authorization``) describe one
connection and are never relayed; the proxy frames each side's body itself. ``Expect`` is answered
by the proxy and dropped too. Field order and repeated fields are kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.request_ids import CLIENT_REQUEST_ID, REQUEST_ID, RequestIds
from proxy.vocabulary import SERVER_HEADER

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
_DROP_UPSTREAM = frozenset({"expect", REQUEST_ID.lower(), CLIENT_REQUEST_ID.lower()})


def connection_scoped(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Lower-cased names of every hop-by-hop field, those named in ``Connection`` included."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
        if token.strip()
    }
    return HOP_BY_HOP | named


def strip_hop_by_hop(headers: Iterable[tuple[str, str]]) -> Headers:
    items = list(headers)
    scoped = connection_scoped(items)
    return [(name, value) for name, value in items if name.lower() not in scoped]


def upstream_request_headers(
    headers: Iterable[tuple[str, str]], *, ids: RequestIds, client_addr: str | None, scheme: str
) -> Headers:
    """The headers to send upstream for a client request carrying ``headers`` (one pass: this
    runs for every call)."""
    out: Headers = []
    named: set[str] = set()  # what Connection names, dropped once it is all known
    forwarded_for: str | None = None
    forwarded_proto = False
    for name, value in headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP:
            if lowered == "connection":
                named.update(t.strip().lower() for t in value.split(",") if t.strip())
        elif lowered in _DROP_UPSTREAM:
            pass
        elif lowered == "x-forwarded-for" and client_addr:
            if forwarded_for is None:
                forwarded_for = value
        else:
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
    out.append((REQUEST_ID, ids.upstream))
    if ids.client is not None and ids.client != ids.upstream:
        out.append((CLIENT_REQUEST_ID, ids.client))
    return out


_REPLACED = frozenset({REQUEST_ID.lower(), "server"})


def client_response_headers(headers: Iterable[tuple[str, str]], *, request_id: str) -> Headers:
    """The headers to send the client for an upstream response carrying ``headers``.

    ``Content-Length`` is kept (the body is relayed byte for byte); chunked framing is redone by
    the proxy. The upstream call's id is always echoed as ``X-Request-Id``; ``Server`` names the
    proxy (as Envoy overwrites it by default), so the upstream's implementation is not advertised.
    """
    out: Headers = []
    named: set[str] = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP:
            if lowered == "connection":
                named.update(t.strip().lower() for t in value.split(",") if t.strip())
        elif lowered not in _REPLACED:
            out.append((name, value))
    if named:
        out = [(n, v) for n, v in out if n.lower() not in named]
    out.append((REQUEST_ID, request_id))
    out.append(("Server", SERVER_HEADER))
    return out
