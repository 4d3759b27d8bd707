"""What one client connection may hold, on every HTTP listener of both processes: a request head
trickled byte by byte (slowloris) is cut at ``--header-timeout``, an idle keep-alive connection at
``--idle-timeout``, a request body that stops arriving at ``--body-timeout`` (408), connections
beyond ``--max-connections`` are closed as they open (on the gateway's gRPC listener too); each
close is counted by reason. A response that streams longer than both timeouts is never cut by
them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from bench.base.addresses import host_port
from bench.base.waiting import wait_until
from proxy.server import Server
from tests.support.gateway import running_gateway
from tests.support.proxy_harness import answer_while_sending, http_url, metric, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

HEADER_S = 0.4
IDLE_S = 0.8
LIMITS = {"header_timeout": HEADER_S, "idle_timeout": IDLE_S, "max_connections": 4}


@pytest.fixture
async def proxy(upstream: ScriptedUpstream) -> AsyncIterator[Server]:
    async with running_proxy(upstream.url, **LIMITS) as server:
        yield server


async def _open(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = host_port(address)
    return await asyncio.open_connection(host, port)


async def _closed_after(reader: asyncio.StreamReader, within: float) -> float:
    """Seconds until the server closed the connection (reading whatever it sent first)."""
    started = time.monotonic()
    async with asyncio.timeout(within):
        while await reader.read(4096):
            pass
    return time.monotonic() - started


async def _quiet_for(reader: asyncio.StreamReader, seconds: float) -> None:
    """The client's pause: wait ``seconds`` for the server to answer or close the connection,
    which it must not do meanwhile."""
    try:
        sent = await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return
    raise AssertionError(f"the server answered or closed during the client's pause: {sent!r}")


async def _trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, within: float
) -> float:
    """Send a request head a header line at a time, one whenever the server has been quiet
    for 50 ms, until the server closes the connection; returns how long that took."""
    started = time.monotonic()
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
    async with asyncio.timeout(within):
        for i in itertools.count():
            try:
                if not await asyncio.wait_for(reader.read(4096), 0.05):
                    return time.monotonic() - started  # closed
            except TimeoutError:
                writer.write(f"X-Slow-{i}: y\r\n".encode())
    raise AssertionError("unreachable")


def _closed(server: Server, listener: str, reason: str) -> float:
    return metric(server, "hangup_proxy_connections_closed_total", listener=listener, reason=reason)


async def test_a_trickled_request_head_is_cut_and_others_are_served(
    proxy: Server, session: aiohttp.ClientSession
) -> None:
    reader, writer = await _open(proxy.addresses["http"])
    trickling = asyncio.ensure_future(_trickle_until_closed(reader, writer, HEADER_S + 2.0))
    try:
        async with session.get(http_url(proxy) + "/echo") as resp:  # meanwhile, others are served
            assert resp.status == 200
        waited = await trickling
    finally:
        trickling.cancel()
        writer.close()
    assert waited < HEADER_S + 1.0  # a trickle would have gone on for five seconds
    assert _closed(proxy, "http", "header_timeout") == 1
    assert _closed(proxy, "http", "idle_timeout") == 0


async def test_an_idle_connection_is_closed_and_counted_on_every_listener(proxy: Server) -> None:
    for listener in ("http", "admin"):
        reader, writer = await _open(proxy.addresses[listener])
        waited = await _closed_after(reader, within=IDLE_S + 2.0)
        writer.close()
        assert IDLE_S * 0.5 < waited < IDLE_S + 1.0, (listener, waited)
        assert _closed(proxy, listener, "idle_timeout") == 1


async def test_a_keep_alive_connection_serves_requests_then_closes_once_idle(
    proxy: Server,
) -> None:
    reader, writer = await _open(proxy.addresses["http"])
    for _ in range(3):
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    await _closed_after(reader, within=IDLE_S + 2.0)
    writer.close()
    assert _closed(proxy, "http", "idle_timeout") == 1


async def test_a_stream_longer_than_both_timeouts_is_not_cut(
    proxy: Server, upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with session.get(http_url(proxy) + "/sse?events=3&gate=1") as resp:
        for _ in range(3):
            # A probe opened now is closed once a whole idle timeout has passed, while nothing
            # moved on the stream's connection either.
            probe, probe_writer = await _open(proxy.addresses["http"])
            await _closed_after(probe, within=IDLE_S + 2.0)
            probe_writer.close()
            await upstream.release()
        body = await resp.read()
    assert body.count(b'data: {"n"') == 3 and body.endswith(b"data: [DONE]\n\n")
    assert _closed(proxy, "http", "idle_timeout") == 3  # the probes, never the stream


async def test_connections_beyond_the_cap_are_closed_as_they_open(
    proxy: Server, session: aiohttp.ClientSession
) -> None:
    held = [await _open(proxy.addresses["http"]) for _ in range(4)]
    reader, writer = await _open(proxy.addresses["http"])
    await _closed_after(reader, within=1.0)
    writer.close()
    assert _closed(proxy, "http", "too_many_connections") == 1
    for r, w in held:
        w.write_eof()  # the server sees the client leave and closes: room again
        await _closed_after(r, within=1.0)
        w.close()
    async with session.get(http_url(proxy) + "/echo") as resp:  # room again
        assert resp.status == 200


async def test_the_gateway_holds_its_connections_to_the_same_limits() -> None:
    async with running_gateway(**LIMITS) as gateway:
        address = gateway.url.removeprefix("http://")
        reader, writer = await _open(address)
        try:
            waited = await _trickle_until_closed(reader, writer, HEADER_S + 2.0)
        finally:
            writer.close()
        assert waited < HEADER_S + 1.0
        reader, writer = await _open(address)
        await _closed_after(reader, within=IDLE_S + 2.0)
        writer.close()
        closed = "hangup_gateway_connections_closed_total"
        assert gateway.metric(closed, listener="http", reason="header_timeout") == 1
        assert gateway.metric(closed, listener="http", reason="idle_timeout") == 1


async def test_the_gateways_grpc_listener_holds_max_connections_too() -> None:
    """Was: the gRPC listener took any number of connections (each a file descriptor the HTTP
    listener shares). Now the connection past --max-connections is closed as it opens."""
    async with running_gateway(max_connections=2) as gateway:
        address = gateway.server.listeners["grpc"]
        own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of each channel's own
        channels = [grpc.aio.insecure_channel(address, options=own) for _ in range(3)]
        codes = []
        try:
            for channel in channels:
                live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
                try:
                    await live(b"", timeout=5)
                    codes.append("OK")
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code().name)
        finally:
            await asyncio.gather(*(c.close() for c in channels))
    assert codes == ["OK", "OK", "UNAVAILABLE"]


async def _raw_answer(address: str, head: bytes, within: float = 1.0) -> bytes:
    """Send ``head`` (and nothing more); the answer's head and body, which must come within
    ``within`` seconds (before, not after, the rest of a declared body)."""
    reader, writer = await _open(address)
    writer.write(head)
    try:
        async with asyncio.timeout(within):
            answer = await reader.readuntil(b"\r\n\r\n")
            length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            return answer + await reader.readexactly(length)
    finally:
        writer.close()


OVERSIZED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 20971520\r\n\r\n{"model": '
)


async def test_a_declared_oversized_body_is_refused_at_once_by_both() -> None:
    """20 MiB declared, a few bytes sent: 413 naming the limit at once, before any more is read,
    and ``Connection: close`` (what is left of the body is discarded, not relayed)."""
    limit = 8 * 1024 * 1024
    async with running_gateway() as gateway:
        answer = await _raw_answer(gateway.url.removeprefix("http://"), OVERSIZED)
        assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer
        assert f"limit of {limit} bytes".encode() in answer
        async with running_proxy(gateway.url) as proxy:  # the proxy's default limit: the same
            answer = await _raw_answer(proxy.addresses["http"], OVERSIZED)
            assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer
            assert f"exceeds {limit}".encode() in answer
        assert not await gateway.in_flight()


BODY_S = 0.5
STALLED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 100\r\n\r\n{"model": '
)


async def test_a_body_that_stalls_is_answered_408_by_both_and_counted() -> None:
    """A declared body that stops arriving: 408 naming the wait after ``--body-timeout``, the
    connection closed and counted; nothing is left in flight on the gateway."""
    closed = "hangup_{}_connections_closed_total"
    async with running_gateway(body_timeout=BODY_S) as gateway:
        answer = await _raw_answer(gateway.url.removeprefix("http://"), STALLED, BODY_S + 1.5)
        assert answer.startswith(b"HTTP/1.1 408") and b"Connection: close" in answer
        assert b"no bytes of the request body arrived for 0.5 s" in answer
        assert gateway.metric(closed.format("gateway"), listener="http", reason="body_timeout") == 1
        async with running_proxy(gateway.url, body_timeout=BODY_S) as proxy:
            answer = await _raw_answer(proxy.addresses["http"], STALLED, BODY_S + 1.5)
            assert answer.startswith(b"HTTP/1.1 408") and b"Connection: close" in answer
            assert (
                metric(proxy, closed.format("proxy"), listener="http", reason="body_timeout") == 1
            )
        assert not await gateway.in_flight()


async def test_a_call_refused_before_its_body_is_read_closes_its_connection_at_once(
    upstream: ScriptedUpstream,
) -> None:
    """A stalled body holds the only call slot; the next client's stalled body is refused 503
    at once, and its connection closed (not left waiting for a body nobody will read)."""
    stalled = STALLED.replace(b"/v1/completions", b"/echo")  # the upstream waits for the body
    async with running_proxy(upstream.url, body_timeout=30, max_concurrent_streams=1) as proxy:
        _, holder = await _open(proxy.addresses["http"])
        try:
            holder.write(stalled)
            await wait_until(lambda: proxy.state is not None and proxy.state.inflight == 1,
                             what="the first call holding the slot")  # fmt: skip
            answer = await _raw_answer(proxy.addresses["http"], stalled)
            assert answer.startswith(b"HTTP/1.1 503") and b"Connection: close" in answer
        finally:
            holder.close()


async def test_a_body_sent_slowly_but_steadily_is_not_cut(upstream: ScriptedUpstream) -> None:
    """The body clock is per read (as nginx's client_body_timeout): 8 bytes, one every
    ``BODY_S / 2``, take twice the timeout in all and are relayed whole."""
    async with running_proxy(upstream.url, body_timeout=BODY_S) as slow_ok:
        reader, writer = await _open(slow_ok.addresses["http"])
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n")
        for byte in b"abcdefgh":
            await _quiet_for(reader, BODY_S / 2)  # no 408 while the body keeps coming
            writer.write(bytes([byte]))
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        writer.close()
        assert head.startswith(b"HTTP/1.1 200") and b'"abcdefgh"' in body
        assert metric(slow_ok, "hangup_proxy_connections_closed_total", listener="http",
                      reason="body_timeout") == 0  # fmt: skip


async def test_no_response_advertises_the_implementation_or_its_version(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async def server_names(url: str, *paths: str) -> set[str]:
        names = set()
        for path in paths:
            async with session.get(url + path) as resp:
                names.add(resp.headers.get("Server", ""))
        return names

    bad_request = b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"  # no colon: a parse error
    async with running_gateway() as gateway, running_proxy(upstream.url) as proxy:
        assert await server_names(gateway.url, "/v1/models", "/nowhere") == {"hangup-gateway"}
        answer = await _raw_answer(gateway.url.removeprefix("http://"), bad_request)
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer
        assert b"Server: hangup-gateway" in answer
        # Relayed (the upstream's own name replaced), the proxy's own errors, the admin port.
        names = await server_names(http_url(proxy), "/echo", "/status/503")
        names |= await server_names(f"http://{proxy.addresses['admin']}", "/healthz", "/nowhere")
        assert names == {"hangup-proxy"}
        answer = await _raw_answer(proxy.addresses["http"], bad_request)
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer
        assert b"Server: hangup-proxy" in answer


async def test_grpc_listeners_close_a_silent_and_an_idle_connection() -> None:
    """A TCP connection that never finishes the HTTP/2 handshake is closed at ``header_timeout``;
    a channel with no call is closed at ``idle_timeout`` (the channel then reconnects by itself
    for its next call)."""
    async with running_gateway(**LIMITS) as gateway:
        target = gateway.server.listeners["grpc"]
        async with running_proxy(gateway.url, upstream_grpc=target, **LIMITS) as proxy:
            for address in (target, proxy.addresses["grpc"]):
                reader, writer = await _open(address)
                writer.write(b"PRI * HTTP/2.0\r\n")  # the start of the preface, never the rest
                waited = await _closed_after(reader, within=HEADER_S + 3.0)
                writer.close()
                assert waited < HEADER_S + 2.0, (address, waited)
            async with grpc.aio.insecure_channel(proxy.addresses["grpc"]) as channel:
                await channel.channel_ready()
                state = await _state_after(channel, grpc.ChannelConnectivity.IDLE, IDLE_S + 3.0)
                assert state is grpc.ChannelConnectivity.IDLE


async def _state_after(
    channel: grpc.aio.Channel, wanted: grpc.ChannelConnectivity, within: float
) -> grpc.ChannelConnectivity:
    async with asyncio.timeout(within):
        while (state := channel.get_state()) is not wanted:
            await channel.wait_for_state_change(state)
    return state


async def test_the_head_clock_starts_at_the_heads_first_byte(proxy: Server) -> None:
    """A keep-alive connection older than the header timeout that sends its next head in two
    writes is served (the clock once ran from the connection's start, closing it mid-head: the
    proxy's upstream connections saw that as a 502 under the protocol fuzz)."""
    reader, writer = await _open(proxy.addresses["http"])
    # A probe opened after it, trickling a head, is cut at the header timeout: the first
    # connection is now older than that (and not idle for too long).
    probe, probe_writer = await _open(proxy.addresses["http"])
    probe_writer.write(b"GET /echo HTTP/1.1\r\n")
    await _closed_after(probe, within=HEADER_S + 2.0)
    probe_writer.close()
    writer.write(b"GET /echo HTTP/1.1\r\n")
    # Less than the limit on purpose: this pause is what the test offers the server (its sweep
    # runs every HEADER_S / 4, so at least one runs while the head is half sent).
    await _quiet_for(reader, HEADER_S / 2)
    writer.write(b"Host: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert _closed(proxy, "http", "header_timeout") == 1  # the probe only


async def test_a_refused_body_still_arriving_does_not_cost_the_client_its_answer(
    upstream: ScriptedUpstream,
) -> None:
    """A client that goes on sending a body the proxy refused (413 on its declared size) reads
    the whole answer and then the end of the connection, not a reset: the proxy reads and drops
    the rest for a while (lingering) instead of closing over unread bytes."""
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"
    async with running_proxy(upstream.url, max_body_size=1000) as proxy:
        for _ in range(5):
            reader, writer = await _open(proxy.addresses["http"])
            writer.write(head)
            async with asyncio.timeout(5):
                answer = await answer_while_sending(reader, writer)
            assert answer.startswith(b"HTTP/1.1 413") and b"exceeds 1000" in answer
    assert not upstream.requests
