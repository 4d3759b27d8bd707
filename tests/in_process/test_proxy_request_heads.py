"""What a client can put in a request head, and what reaches the upstream of it (issue 48): trailer
fields never become header fields, ``CONNECT`` is refused and never sent, ``Host`` as RFC 9112
section 3.2 says, origin-form targets without a fragment, HTTP/1.0 and 1.1 only, ``chunked`` the
only transfer coding. The upstream logs every byte and reads them with h11
(``bench/harness/recording_upstream.py``), so each test sees what a server behind the proxy reads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bench.base.addresses import host_port
from bench.harness.recording_upstream import RecordingUpstream
from proxy.server import Server
from proxy.upstream.framing import request_head
from tests.support.proxy_harness import running_proxy


@pytest.fixture
async def upstream() -> AsyncIterator[RecordingUpstream]:
    async with RecordingUpstream() as recording:
        yield recording


async def _exchange(proxy: Server, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Write ``data`` on a new connection; the first answer's status, fields and body (it is
    framed by Content-Length: the recording upstream's and the proxy's own errors are)."""
    host, port = host_port(proxy.addresses["http"])
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines[1:] if line)
        fields = {name.lower(): value for name, value in fields.items()}
        body = await reader.readexactly(int(fields.get("content-length", "0")))
        return int(lines[0].split(" ")[1]), fields, body
    finally:
        writer.close()


TRAILERED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\nAuthorization: Bearer from-trailer\r\nHost: b\r\n"
    b"X-Request-Id: from-trailer\r\nX-Custom: from-trailer\r\n\r\n"
)


async def test_trailer_fields_in_the_heads_write_never_reach_the_upstreams_head(
    upstream: RecordingUpstream,
) -> None:
    """The trailer arrives in the same read as the head: httptools calls back for trailer fields
    as for header fields, and they once joined the request's fields before its relay began (a
    client could set what a front door strips: credentials, a second Host, the request id)."""
    async with running_proxy(upstream.url, trust_client_request_id=True) as proxy:
        status, fields, _ = await _exchange(proxy, TRAILERED)
    assert status == 200
    (seen,) = upstream.log
    assert seen.body == b"hello"
    assert b"from-trailer" not in seen.head, seen.head
    assert seen.field_values(b"host") == [b"a"]
    assert seen.field_values(b"authorization") == []
    assert fields["x-request-id"] != "from-trailer"  # the id is not the trailer's either


async def test_trailer_fields_count_against_the_header_limit(upstream: RecordingUpstream) -> None:
    """Dropped, but not free: a request whose head and trailer together pass --max-headers is
    refused, as one whose head alone does."""
    trailer = b"".join(b"X-T%d: 1\r\n" % n for n in range(8))
    data = (
        b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n" + trailer + b"\r\n"
    )
    async with running_proxy(upstream.url, max_headers=8) as proxy:
        status, _, body = await _exchange(proxy, data)
    assert status == 400
    assert "more than 8 header fields" in json.loads(body)["error"]["message"]
    assert not [p for p in upstream.log if p.complete]


async def test_connect_is_refused_and_never_reaches_the_upstream(
    upstream: RecordingUpstream,
) -> None:
    """``CONNECT /path`` was relayed, and an upstream that honours it (as this one does: a
    tunnel from the end of its head) would read every later request on that pooled connection
    as tunnel bytes."""
    async with running_proxy(upstream.url) as proxy:
        status, fields, body = await _exchange(
            proxy, b"CONNECT /v1/completions HTTP/1.1\r\nHost: a\r\n\r\n"
        )
        after, _, _ = await _exchange(proxy, b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
    assert status == 400 and fields["connection"] == "close"
    assert "CONNECT" in json.loads(body)["error"]["message"]
    assert after == 200
    assert [p.target for p in upstream.log] == [b"/after"]


def test_the_upstream_client_never_sends_connect() -> None:
    with pytest.raises(ValueError, match="CONNECT"):
        request_head("CONNECT", "/x", "up", [], None)


@pytest.mark.parametrize(
    ("data", "status", "named"),
    [
        (b"GET /c HTTP/1.1\r\n\r\n", 400, "no Host"),
        (b"GET /c HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "2 Host"),
        (b"GET /c HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "2 Host"),
        (b"GET /c HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "2 Host"),
        (b"GET /c HTTP/1.1\r\nHost: user@a\r\n\r\n", 400, "not host[:port]"),
        (b"GET /c HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "not host[:port]"),
        (b"GET /c#frag HTTP/1.1\r\nHost: a\r\n\r\n", 400, "fragment"),
        (b"GET http://a/c HTTP/1.1\r\nHost: a\r\n\r\n", 400, "origin-form"),
        (b"GET /c HTTP/2.0\r\nHost: a\r\n\r\n", 505, "version 2.0"),
        (b"GET /c\r\n\r\n", 505, "version 0.9"),
        (b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
         501, "gzip, chunked"),
        (b"POST /c HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "HTTP/1.0"),
    ],
    ids=["no-host", "two-same-hosts", "two-hosts", "two-hosts-http10", "host-userinfo",
         "host-space", "fragment", "absolute-form", "http2", "http09", "gzip-chunked",
         "chunked-http10"],
)  # fmt: skip
async def test_a_head_the_rfc_refuses_is_answered_and_never_relayed(
    upstream: RecordingUpstream, data: bytes, status: int, named: str
) -> None:
    async with running_proxy(upstream.url) as proxy:
        answered, fields, body = await _exchange(proxy, data)
    assert answered == status
    assert named in json.loads(body)["error"]["message"]
    assert fields["connection"] == "close"
    assert upstream.log == []


async def test_an_http10_request_without_host_gets_the_upstreams(
    upstream: RecordingUpstream,
) -> None:
    async with running_proxy(upstream.url) as proxy:
        status, _, _ = await _exchange(proxy, b"GET /c HTTP/1.0\r\n\r\n")
    assert status == 200
    (seen,) = upstream.log
    assert seen.field_values(b"host") == [f"127.0.0.1:{upstream.port}".encode()]
