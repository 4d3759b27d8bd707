"""What the proxy's HTTP/1.1 server refuses in a request head that llhttp accepts.

llhttp (strict, as httptools runs it) already refuses what cannot be framed one way only: both
``Content-Length`` and ``Transfer-Encoding``, two lengths, a length that is not digits, a
``Transfer-Encoding`` whose last coding is not ``chunked``, bad bytes in names, values and
targets, obs-fold, bare CR or LF. It accepts, and the RFCs or a sidecar's position refuse:

- ``CONNECT`` (400): the proxy relays requests and never tunnels; a relayed ``CONNECT`` could
  turn its upstream connection into a tunnel that the pool then hands to the next client.
- a target that is not origin-form (absolute-form, ``*``), or that carries a ``#fragment``
  (400): a client never sends a fragment (RFC 9110 section 4.2.5), and a sidecar relays paths.
- an HTTP/1.1 request with no ``Host``, or any request with more than one or with a value that
  is not ``host[:port]`` (400, RFC 9112 section 3.2). HTTP/1.0 without ``Host`` is relayed (the
  upstream gets its own host).
- a version other than 1.0 and 1.1 (505): llhttp takes ``HTTP/0.9`` (a bare ``GET /``) and
  ``HTTP/2.0`` request lines.
- a transfer coding other than ``chunked`` (501, RFC 9112 section 6.1: the proxy decodes the
  chunks and relays the body, so ``gzip, chunked`` would reach the upstream as gzip bytes with
  nothing saying so); ``Transfer-Encoding`` in an HTTP/1.0 request (400: section 6.1 calls its
  framing faulty).

No I/O: the fields in, a refusal out. It runs for every request: a few comparisons and, for the
``Host`` value, one regular expression.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# uri-host [":" port] (RFC 3986): an IP literal in brackets, or a reg-name / IPv4 address.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?")


class Refusal(NamedTuple):
    status: int
    message: str


def _shown(value: bytes) -> str:
    return repr(value[:100].decode("latin-1"))


def refusal(
    method: bytes, target: bytes, version: str, hosts: list[bytes], codings: list[bytes]
) -> Refusal | None:
    """Why a request head with these parts is refused, or None to serve it. ``hosts`` and
    ``codings`` are the values of its ``Host`` and ``Transfer-Encoding`` fields, in order."""
    if version != "1.1" and version != "1.0":
        return Refusal(505, f"HTTP version {version} is not supported: HTTP/1.1 or HTTP/1.0")
    if method == b"CONNECT":
        return Refusal(400, "CONNECT is not supported: hangup-proxy relays requests, not tunnels")
    if not target.startswith(b"/"):
        return Refusal(400, f"the request target is not a path (origin-form): {_shown(target)}")
    if b"#" in target:
        return Refusal(400, f"the request target carries a fragment: {_shown(target)}")
    if len(hosts) != 1:
        if len(hosts) > 1:
            return Refusal(400, f"the request has {len(hosts)} Host header fields, not one")
        if version == "1.1":
            return Refusal(400, "the request has no Host header field (HTTP/1.1 requires one)")
    elif _HOST.fullmatch(hosts[0].strip(b" \t")) is None:
        return Refusal(400, f"the Host header field is not host[:port]: {_shown(hosts[0])}")
    if codings:
        if version == "1.0":
            return Refusal(400, "Transfer-Encoding in an HTTP/1.0 request: its framing is faulty")
        if len(codings) > 1 or codings[0].strip(b" \t").lower() != b"chunked":
            joined = b", ".join(codings)
            return Refusal(501, f"transfer coding {_shown(joined)} is not supported: only chunked")
    return None
