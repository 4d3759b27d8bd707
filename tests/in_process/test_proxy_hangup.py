"""A client hang-up in every stage becomes one explicit cancel call upstream (in-process proxy).

The upstream here is the scripted one (tests/support/scripted_upstream.py): it holds requests open
and records cancel calls. No test waits for time to pass: each waits for the upstream to hold the
request, then hangs up, then waits for the cancel call to arrive.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from bench.base.waiting import wait_until
from proxy.config import AdapterName
from tests.support.proxy_harness import http_url, metric, raw_request, running_proxy, wait_metric
from tests.support.scripted_upstream import ScriptedUpstream


def _head(path: str, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: model\r\n{extra}\r\n".encode()


async def test_hangup_while_waiting_for_first_byte_cancels_upstream(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url, cancel_token="s3cret") as proxy:
        _, writer = await raw_request(
            proxy.addresses["http"],
            _head("/hold", "Content-Length: 2\r\nX-Request-Id: mine\r\n") + b"{}",
        )
        await upstream.held.wait()
        writer.close()  # the client leaves; the proxy has nothing to write, so it must read the FIN
        (cancel,) = await upstream.wait_cancels(1)
        assert cancel.reason == "client_disconnect"
        assert cancel.authorization == "Bearer s3cret"
        assert cancel.request_id != "mine" and len(cancel.request_id) == 32
        await upstream.closed.wait()  # the upstream connection was closed as well
        await wait_metric(
            proxy, "hangup_proxy_cancel_calls_total", 1, adapter="hangup", result="ok"
        )
        assert (
            metric(
                proxy,
                "hangup_proxy_client_disconnects_total",
                protocol="http",
                stage="before_response",
            )
            == 1
        )
        assert (
            metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="cancelled") == 1
        )
        assert metric(proxy, "hangup_proxy_disconnect_to_cancel_seconds_count") == 1


async def test_hangup_while_body_still_arriving_cancels_upstream(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url) as proxy:
        head = _head("/hold", "Content-Length: 1000\r\n") + b"x" * 10
        _, writer = await raw_request(proxy.addresses["http"], head)
        await upstream.body_started.wait()  # part of the body reached the upstream
        writer.close()
        (cancel,) = await upstream.wait_cancels(1)
        assert cancel.reason == "client_disconnect"
        await upstream.closed.wait()
        await wait_metric(
            proxy, "hangup_proxy_requests_total", 1, protocol="http", outcome="cancelled"
        )
        assert (
            metric(
                proxy,
                "hangup_proxy_client_disconnects_total",
                protocol="http",
                stage="before_response",
            )
            == 1
        )


async def test_hangup_while_streaming_cancels_upstream(upstream: ScriptedUpstream) -> None:
    async with running_proxy(upstream.url) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"], b"GET /sse?events=5&gate=1 HTTP/1.1\r\nHost: model\r\n\r\n"
        )
        await upstream.release(1)
        received = b""
        while b'data: {"n": 0}' not in received:
            received += await reader.read(4096)
        assert received.startswith(b"HTTP/1.1 200")
        writer.close()
        (cancel,) = await upstream.wait_cancels(1)
        assert cancel.reason == "client_disconnect"
        await wait_metric(
            proxy, "hangup_proxy_client_disconnects_total", 1, protocol="http", stage="streaming"
        )


async def test_half_closed_client_counts_as_hangup(upstream: ScriptedUpstream) -> None:
    """A client that shuts down its write side after a complete request has hung up
    (docs/proxy.md)."""
    async with running_proxy(upstream.url) as proxy:
        reader, writer = await raw_request(
            proxy.addresses["http"], _head("/hold", "Content-Length: 0\r\n")
        )
        await upstream.held.wait()
        sock = writer.get_extra_info("socket")
        sock.shutdown(socket.SHUT_WR)
        (cancel,) = await upstream.wait_cancels(1)
        assert cancel.reason == "client_disconnect"
        assert await reader.read() == b""  # the proxy closes its side without a response
        writer.close()


async def test_max_request_duration_answers_504_and_cancels(upstream: ScriptedUpstream) -> None:
    async with running_proxy(upstream.url, max_request_duration=0.2) as proxy:
        async with (
            aiohttp.ClientSession() as client,
            client.post(http_url(proxy) + "/hold", data=b"{}") as resp,
        ):
            assert resp.status == 504
            body = await resp.json()
            request_id = resp.headers["X-Request-Id"]
        assert "max-request-duration" in body["error"]["message"]
        (cancel,) = await upstream.wait_cancels(1)
        assert (cancel.request_id, cancel.reason) == (request_id, "proxy_timeout")
        assert (
            metric(
                proxy,
                "hangup_proxy_client_disconnects_total",
                protocol="http",
                stage="before_response",
            )
            == 0
        )


async def test_shutdown_drains_then_cancels_with_reason_shutdown(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url, drain_timeout=0.3) as proxy:
        admin = f"http://{proxy.addresses['admin']}"
        async with aiohttp.ClientSession() as client:
            held = asyncio.ensure_future(client.post(http_url(proxy) + "/hold", data=b"{}"))
            await upstream.held.wait()
            shutdown = asyncio.ensure_future(proxy.shutdown())
            assert proxy.state is not None
            await wait_until(lambda: proxy.state is not None and proxy.state.draining)
            async with client.get(admin + "/readyz") as ready:
                assert ready.status == 503
            (cancel,) = await upstream.wait_cancels(1)
            assert cancel.reason == "shutdown"
            await shutdown
            with pytest.raises(aiohttp.ClientError):
                await held
        assert metric(proxy, "hangup_proxy_cancels_total", protocol="http", reason="shutdown") == 1


async def test_shutdown_cuts_a_stream_it_stopped_at_once(upstream: ScriptedUpstream) -> None:
    """A stream still going when the drain runs out is cancelled upstream and cut for its client
    at once (the connection closes), not when the listener's close gives up on it seconds later:
    until then the client waited on a stream that had ended, and the pod on the proxy's exit."""
    drain, slack = 0.3, 2.0  # the listener's close waits up to 5 s for a connection still busy
    async with (
        running_proxy(upstream.url, drain_timeout=drain) as proxy,
        aiohttp.ClientSession() as client,
        client.get(http_url(proxy) + "/sse?events=5&gate=1") as resp,
    ):
        await upstream.release(1)
        assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
        started = loop_time()
        shutdown = asyncio.ensure_future(proxy.shutdown())
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()  # cut: the last chunk never comes
        cut = loop_time() - started
        await shutdown
        stopped = loop_time() - started
        (cancel,) = await upstream.wait_cancels(1)
        assert cancel.reason == "shutdown"
    assert cut < drain + slack, f"the stream was cut {cut:.2f} s after the shutdown began"
    assert stopped < drain + slack, f"the proxy stopped {stopped:.2f} s after the shutdown began"


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def test_none_adapter_closes_upstream_without_cancel_call(upstream: ScriptedUpstream) -> None:
    async with running_proxy(upstream.url, cancel_adapter=AdapterName.NONE) as proxy:
        _, writer = await raw_request(
            proxy.addresses["http"], _head("/hold", "Content-Length: 0\r\n")
        )
        await upstream.held.wait()
        writer.close()
        await upstream.closed.wait()
        await wait_metric(
            proxy, "hangup_proxy_requests_total", 1, protocol="http", outcome="cancelled"
        )
        assert upstream.cancels == []


async def test_max_request_duration_mid_stream_cuts_the_stream_and_cancels(
    upstream: ScriptedUpstream,
) -> None:
    async with (
        running_proxy(upstream.url, max_request_duration=0.3) as proxy,
        aiohttp.ClientSession() as client,
        client.get(http_url(proxy) + "/sse?events=5&gate=1") as resp,
    ):
        await upstream.release(1)
        assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
        with pytest.raises(aiohttp.ClientPayloadError):  # cut: no final chunk, never "complete"
            await resp.read()
        (cancel,) = await upstream.wait_cancels(1)
        assert (cancel.request_id, cancel.reason) == (resp.headers["X-Request-Id"], "proxy_timeout")
