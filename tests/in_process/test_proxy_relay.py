"""Relaying through the in-process proxy to the scripted upstream: bodies and events streamed both
ways without buffering, headers rewritten, upstream errors passed through intact, the proxy's own
errors clear and JSON, limits enforced without harming other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from hangup_contract.runtime.logs import JsonFormatter
from tests.support.proxy_harness import http_url, metric, raw_request, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream


async def test_request_and_response_are_relayed_with_rewritten_headers(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url) as proxy:
        headers = {"X-Request-Id": "client-1", "Connection": "keep-alive, X-Hop", "X-Hop": "1"}
        async with session.put(
            http_url(proxy) + "/echo/a?b=c", data=b"payload", headers=headers
        ) as resp:
            seen = await resp.json()
            assert resp.status == 200
            echoed_id = resp.headers["X-Request-Id"]
    sent = {name.lower(): value for name, value in seen["headers"]}
    assert (seen["method"], seen["path"], seen["body"]) == ("PUT", "/echo/a?b=c", "payload")
    assert sent["x-request-id"] == echoed_id != "client-1"
    assert sent["x-client-request-id"] == "client-1"
    assert sent["x-forwarded-for"] == "127.0.0.1"
    assert sent["x-forwarded-proto"] == "http"
    assert "x-hop" not in sent


async def test_sse_events_are_relayed_one_by_one_without_batching(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    """The upstream sends event n+1 only after the client has received event n through the proxy."""
    async with (
        running_proxy(upstream.url) as proxy,
        session.get(http_url(proxy) + "/sse?events=4&gate=1") as resp,
    ):
        assert resp.headers["Content-Type"] == "text/event-stream"
        received = b""
        for n in range(4):
            await upstream.release(1)
            while f'"n": {n}}}'.encode() not in received:
                received += await resp.content.readany()
        received += await resp.content.read()
    assert (
        received
        == b"".join(f'data: {{"n": {n}}}\n\n'.encode() for n in range(4)) + b"data: [DONE]\n\n"
    )


async def test_chunked_request_body_is_streamed_up_as_it_arrives(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url) as proxy:
        head = b"POST /hold HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
        _, writer = await raw_request(proxy.addresses["http"], head)
        await upstream.body_started.wait()  # the first chunk went up before the body ended
        writer.write(b"0\r\n\r\n")
        await upstream.held.wait()
        writer.close()
        await upstream.wait_cancels(1)


async def test_upstream_errors_pass_through_intact(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with (
        running_proxy(upstream.url) as proxy,
        session.get(http_url(proxy) + "/status/422") as resp,
    ):
        assert resp.status == 422
        assert (await resp.json())["error"]["message"] == "scripted 422"
        assert (
            metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="completed") == 1
        )


async def test_upstream_down_is_a_clear_503(session: aiohttp.ClientSession) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    async with (
        running_proxy(dead) as proxy,
        session.post(http_url(proxy) + "/v1/completions", data=b"{}") as resp,
    ):
        assert resp.status == 503
        error = (await resp.json())["error"]
        assert error["type"] == "proxy_error" and "unavailable" in error["message"]
        assert resp.headers["X-Request-Id"]
        assert (
            metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="upstream_error")
            == 1
        )


async def test_upstream_breaking_mid_response_never_looks_complete(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url) as proxy:
        async with session.get(http_url(proxy) + "/break") as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        async with session.get(http_url(proxy) + "/echo") as resp:  # the proxy is fine afterwards
            assert resp.status == 200


async def test_concurrent_stream_limit_answers_503_and_spares_the_others(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url, max_concurrent_streams=1) as proxy:
        held = asyncio.ensure_future(session.post(http_url(proxy) + "/hold", data=b"{}"))
        await upstream.held.wait()
        async with aiohttp.ClientSession() as other, other.get(http_url(proxy) + "/echo") as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert "concurrent streams" in (await resp.json())["error"]["message"]
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        await upstream.wait_cancels(1)


async def test_body_limit_answers_413_for_declared_and_streamed_bodies(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url, max_body_size=10) as proxy:
        async with session.post(http_url(proxy) + "/echo", data=b"x" * 11) as resp:
            assert resp.status == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield b"x" * 5

        async with session.post(http_url(proxy) + "/echo", data=chunks()) as resp:
            assert resp.status == 413
            assert "exceeds 10 bytes" in (await resp.json())["error"]["message"]
        async with session.post(http_url(proxy) + "/echo", data=b"x" * 10) as resp:
            assert resp.status == 200
    assert upstream.requests and all(len(str(r["body"])) <= 10 for r in upstream.requests)


async def test_oversized_or_too_many_headers_are_refused_with_a_one_line_warning(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="hangup.proxy.http.server")
    async with running_proxy(upstream.url, max_header_size=100, max_headers=8) as proxy:
        async with session.get(http_url(proxy) + "/echo", headers={"X-Big": "y" * 200}) as resp:
            assert resp.status == 431
            message = (await resp.json())["error"]["message"]
            assert message == "header 'X-Big' is longer than 100 bytes"
        many = {f"X-H{i}": "y" for i in range(12)}
        async with session.get(http_url(proxy) + "/echo", headers=many) as resp:
            assert resp.status == 431
            assert (await resp.json())["error"]["message"] == "more than 8 header fields"
        async with session.get(http_url(proxy) + "/echo?" + "q" * 200) as resp:
            assert resp.status == 414
            assert "longer than 100 bytes" in (await resp.json())["error"]["message"]
        async with session.get(http_url(proxy) + "/echo", headers={"X-Small": "y"}) as resp:
            assert resp.status == 200
    assert len(upstream.requests) == 1
    records = [r for r in caplog.records if r.name == "hangup.proxy.http.server"]
    assert [r.levelname for r in records] == ["WARNING", "WARNING", "WARNING"]
    assert all(
        r.exc_info is None and r.getMessage().startswith("bad request from 127.0.0.1")
        for r in records
    )


async def test_one_json_log_line_per_call(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="hangup.proxy.call")
    async with (
        running_proxy(upstream.url) as proxy,
        session.get(http_url(proxy) + "/echo", headers={"X-Request-Id": "c-9"}) as resp,
    ):
        await resp.read()
        call_id = resp.headers["X-Request-Id"]
    (record,) = [r for r in caplog.records if r.name == "hangup.proxy.call"]
    fields = json.loads(JsonFormatter().format(record))
    assert fields["msg"] == "call" and fields["level"] == "info"
    assert fields["request_id"] == call_id and fields["client_request_id"] == "c-9"
    assert (fields["status"], fields["outcome"], fields["stage"]) == (200, "completed", "streaming")
    assert fields["reason"] is None and fields["duration_ms"] >= fields["upstream_ttfb_ms"] >= 0


async def test_expect_100_continue_is_answered_after_the_limits(upstream: ScriptedUpstream) -> None:
    async with running_proxy(upstream.url, max_body_size=100) as proxy:
        head = (
            b"POST /echo HTTP/1.1\r\nHost: m\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        reader, writer = await raw_request(proxy.addresses["http"], head)
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
        head = (
            b"POST /echo HTTP/1.1\r\nHost: m\r\nContent-Length: 500\r\nExpect: 100-continue\r\n\r\n"
        )
        reader, writer = await raw_request(proxy.addresses["http"], head)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 413")
        writer.close()
    assert [r["body"] for r in upstream.requests] == ["hello"]


async def test_head_and_no_content_responses_carry_no_body(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url) as proxy:
        async with session.head(http_url(proxy) + "/echo") as resp:
            assert resp.status == 200 and await resp.read() == b""
        async with session.get(http_url(proxy) + "/status/204") as resp:
            assert resp.status == 204 and await resp.read() == b""
        async with session.get(http_url(proxy) + "/echo") as resp:  # the connection is still sound
            assert (await resp.json())["method"] == "GET"


async def test_upstream_connect_timeout_is_a_clear_504(session: aiohttp.ClientSession) -> None:
    """An upstream whose accept queue is full never completes the handshake (Linux drops SYNs)."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    address = full.getsockname()
    fillers = []
    for _ in range(4):  # fill the accept queue; nothing ever accepts
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(address)
        fillers.append(filler)
    try:
        upstream = f"http://127.0.0.1:{address[1]}"
        async with (
            running_proxy(upstream, upstream_connect_timeout=0.3) as proxy,
            session.get(http_url(proxy) + "/v1/models") as resp,
        ):
            assert resp.status == 504
            assert "did not answer in time" in (await resp.json())["error"]["message"]
    finally:
        for filler in fillers:
            filler.close()
        full.close()


async def test_upstream_speaking_garbage_is_a_clear_502(session: aiohttp.ClientSession) -> None:
    async def garbage(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"this is not HTTP\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with (
        server,
        running_proxy(f"http://127.0.0.1:{port}") as proxy,
        session.get(http_url(proxy) + "/v1/models") as resp,
    ):
        assert resp.status == 502
        assert (await resp.json())["error"]["type"] == "proxy_error"


@pytest.mark.parametrize("target", [b"http://elsewhere/v1/models", b"*"])
async def test_a_target_that_is_not_a_path_is_a_clear_400(
    upstream: ScriptedUpstream, target: bytes
) -> None:
    """An absolute-form target was glued to the upstream URL: a 502 naming the upstream, until
    the protocol fuzz found it (tests/multi_process/test_protocol_fuzz.py)."""
    async with running_proxy(upstream.url) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"], b"GET " + target + b" HTTP/1.1\r\nHost: m\r\n\r\n"
        )
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert head.split(b" ")[1] == b"400"  # aiohttp's parser already refuses "*"
    assert not upstream.requests  # nothing was sent upstream


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One answer off a raw connection: its status line, its fields (lower-cased names), its body
    (framed by length, chunks, or the end of the connection)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in head[1:] if line)
    fields = {name.lower(): value for name, value in fields.items()}
    if "content-length" in fields:
        return head[0].encode(), fields, await reader.readexactly(int(fields["content-length"]))
    if fields.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
        return head[0].encode(), fields, body
    return head[0].encode(), fields, await reader.read()


async def test_pipelined_requests_are_answered_in_order_then_a_bad_one_closes(
    upstream: ScriptedUpstream,
) -> None:
    """Three requests and a line that is no request, in one write: three answers in the order
    asked, each from its own upstream call, then a 400 naming the problem, then the close."""
    async with running_proxy(upstream.url) as proxy:
        pipelined = b"".join(
            f"GET /echo/{n} HTTP/1.1\r\nHost: m\r\n\r\n".encode() for n in range(3)
        )
        reader, writer = await raw_request(proxy.addresses["http"], pipelined + b"NOT HTTP\r\n\r\n")
        try:
            async with asyncio.timeout(5):
                answers = [await _answer(reader) for _ in range(3)]
                status, fields, body = await _answer(reader)
                assert await reader.read() == b""  # closed
        finally:
            writer.close()
    assert [json.loads(body)["path"] for _, _, body in answers] == ["/echo/0", "/echo/1", "/echo/2"]
    assert len({fields["x-request-id"] for _, fields, _ in answers}) == 3
    assert status == b"HTTP/1.1 400 Bad Request" and fields["connection"] == "close"
    assert "could not be parsed" in json.loads(body)["error"]["message"]


async def test_an_http_1_0_client_gets_a_stream_framed_by_the_close(
    upstream: ScriptedUpstream,
) -> None:
    """HTTP/1.0 has no chunked encoding: a stream without a length ends with the connection."""
    async with running_proxy(upstream.url) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"], b"GET /sse?events=2 HTTP/1.0\r\nHost: m\r\n\r\n"
        )
        try:
            async with asyncio.timeout(5):
                status, fields, body = await _answer(reader)
        finally:
            writer.close()
    assert status == b"HTTP/1.1 200 OK" and "transfer-encoding" not in fields
    assert body == b'data: {"n": 0}\n\ndata: {"n": 1}\n\ndata: [DONE]\n\n'


async def test_a_head_request_gets_no_body_and_the_connection_serves_another(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"],
            b"HEAD /sse?events=2 HTTP/1.1\r\nHost: m\r\n\r\nGET /echo HTTP/1.1\r\nHost: m\r\n\r\n",
        )
        try:
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                status, _, body = await _answer(reader)  # the next answer follows at once
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding" not in head
    assert status == b"HTTP/1.1 200 OK" and json.loads(body)["method"] == "GET"


async def test_a_chunked_body_that_breaks_off_is_answered_400_at_once(
    upstream: ScriptedUpstream,
) -> None:
    """A chunk size that is not hex, after a chunk already relayed: 400 naming it at once (not
    a wait for the body timeout), and the connection closes."""
    async with running_proxy(upstream.url, body_timeout=30) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"],
            b"POST /echo HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\nZZ\r\n",
        )
        try:
            async with asyncio.timeout(5):
                status, fields, body = await _answer(reader)
                assert await reader.read() == b""  # closed
        finally:
            writer.close()
    assert status == b"HTTP/1.1 400 Bad Request" and fields["connection"] == "close"
    assert json.loads(body)["error"]["message"].startswith("the request body is broken")
