"""The proxy's HTTP/1.1 client (``proxy.upstream.client``) against scripted raw HTTP/1.1 servers on
127.0.0.1: keep-alive reuse, a reused connection the upstream had closed, every response framing,
interim answers, broken and unreadable answers; and, through the proxy, a client that stops
reading holds the upstream back instead of making the proxy buffer its stream.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator

import pytest

from bench.base.addresses import host_port
from bench.base.waiting import wait_until
from bench.harness.raw_http import RawServer, ok, read_request
from proxy.errors import UpstreamBroken, UpstreamUnavailable
from proxy.upstream.client import Client
from tests.support.proxy_harness import http_url, running_proxy

QUIET_S = 0.5  # seconds without a block getting out that count as a stalled upstream


class Collect:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def flush(self) -> None:
        pass

    def full(self) -> bool:
        return False

    async def drain(self) -> None:
        return None


async def get(upstream: Client, target: str = "/", body: bytes | None = None) -> bytes:
    response = await upstream.request("POST" if body else "GET", target, [], body)
    sink = Collect()
    await response.stream_to(sink)
    response.release()
    return b"".join(sink.chunks)


async def test_sequential_calls_reuse_one_connection() -> None:
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(ok(b"got " + body))

    async with RawServer(keep_alive) as server:
        upstream = Client(server.url, connect_timeout=5)
        answers = [await get(upstream, body=b"%d" % i) for i in range(5)]
        await upstream.close()
    assert answers == [b"got %d" % i for i in range(5)]
    assert server.connections == 1


async def test_a_reused_connection_closed_before_answering_is_replaced_and_the_call_resent() -> (
    None
):
    bodies: list[bytes] = []

    async def first_closes_early(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        while True:
            bodies.append((await read_request(r))[1])
            if first and len(bodies) == 2:  # as when an idle timeout meets the request
                return
            w.write(ok(b"answer"))  # no "Connection: close": the client may reuse it

    async with RawServer(first_closes_early) as server:
        upstream = Client(server.url, connect_timeout=5)
        assert await get(upstream, body=b"one") == b"answer"
        assert await get(upstream, body=b"two") == b"answer"
        await upstream.close()
    assert server.connections == 2
    assert bodies == [b"one", b"two", b"two"]


async def test_start_resends_once_on_a_fresh_connection_and_a_cancel_drops_it() -> None:
    """``Client.start`` (the relay's way: no task while a connection is idle) resends a request
    whose reused connection closed before answering, as ``request`` does; cancelling the wait
    for its head leaves the call open, and closing it drops the connection, which the server
    sees end."""
    bodies: list[bytes] = []
    ended = asyncio.Event()

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        while True:
            try:
                bodies.append((await read_request(r))[1])
            except asyncio.IncompleteReadError:
                ended.set()  # the client dropped the connection
                raise
            if first and len(bodies) == 2:
                return
            if bodies[-1] == b"held":
                continue  # never answered
            w.write(ok(b"answer " + bodies[-1]))

    async def started(upstream: Client, body: bytes) -> bytes:
        response = await upstream.start("POST", "/", [], body).head
        answer = await response.read(100)
        response.release()
        return answer

    async with RawServer(script) as server:
        upstream = Client(server.url, connect_timeout=5)
        assert await started(upstream, b"one") == b"answer one"
        assert await started(upstream, b"two") == b"answer two"  # resent on a fresh connection
        held = upstream.start("POST", "/", [], b"held")
        await wait_until(lambda: bodies[-1:] == [b"held"], what="the held request")
        held.head.cancel()  # the caller stopped waiting: the call goes on
        await asyncio.sleep(QUIET_S)
        assert not ended.is_set()
        held.close()
        async with asyncio.timeout(5):
            await ended.wait()
        await upstream.close()
    assert server.connections == 2
    assert bodies == [b"one", b"two", b"two", b"held"]


async def test_no_resend_for_a_call_whose_caller_stopped_waiting() -> None:
    """A reused connection that closes before answering is not replaced for a caller that has
    stopped waiting for the head (a client that hung up, its cancel on the way): sending the
    request again would start upstream work that nobody will read or cancel."""
    bodies: list[bytes] = []
    second, caller_left = asyncio.Event(), asyncio.Event()

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            bodies.append((await read_request(r))[1])
            if len(bodies) == 1:
                w.write(ok(b"first"))
                continue
            second.set()
            await caller_left.wait()
            return  # closed without an answer, as an idle timeout meeting the request does

    async with RawServer(script) as server:
        upstream = Client(server.url, connect_timeout=5)
        response = await upstream.start("POST", "/", [], b"one").head
        await response.read(100)
        response.release()
        call = upstream.start("POST", "/", [], b"two")  # on the reused connection
        async with asyncio.timeout(5):
            await second.wait()
        call.head.cancel()
        caller_left.set()
        await asyncio.sleep(QUIET_S)  # no resend within it
        call.close()
        await upstream.close()
    assert bodies == [b"one", b"two"]
    assert server.connections == 1


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
         b"abcde"),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
         + ok(b"final"), b"final"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    ids=["chunked", "until-close", "interim-answers-skipped", "no-content"],
)  # fmt: skip
async def test_every_response_framing_is_read_to_its_end(answer: bytes, body: bytes) -> None:
    async def scripted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(0, len(answer), 7):  # split anywhere, as TCP may
            writer.write(answer[i : i + 7])  # an empty buffer: sent at once, on its own
            await writer.drain()

    async with RawServer(scripted) as server:
        upstream = Client(server.url, connect_timeout=5)
        assert await get(upstream) == body
        await upstream.close()


async def test_a_head_answer_has_no_body_to_wait_for() -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        await reader.read()  # no body follows; the connection stays open until the client's close

    async with RawServer(head) as server:
        upstream = Client(server.url, connect_timeout=5)
        response = await upstream.request("HEAD", "/", [], None)
        async with asyncio.timeout(5):
            await response.stream_to(Collect())
        assert (response.status, response.headers) == (200, [("Content-Length", "1000")])
        response.release()
        await upstream.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "broke off"),
        (b"SPDY/9 200 OK\r\n\r\n", "not HTTP/1.1"),
        # What the proxy cannot relay faithfully: a coding it would drop unsaid, a switch of
        # protocols nobody asked for, a head past any client's limit.
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
         "transfer coding 'gzip, chunked'"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
         "switch of protocols"),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\nContent-Length: 0\r\n\r\n",
         "over 65536 bytes"),
    ],
    ids=["cut-short", "not-http", "gzip-chunked", "unasked-101", "huge-head"],
)  # fmt: skip
async def test_a_broken_or_unreadable_answer_is_an_error(answer: bytes, why: str) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()

    async with RawServer(broken) as server:
        upstream = Client(server.url, connect_timeout=5)
        with pytest.raises(UpstreamBroken, match=re.escape(f"upstream {server.url} ")) as error:
            await get(upstream)
        assert why in str(error.value)
        await upstream.close()


async def test_bytes_past_an_answers_end_drop_its_connection() -> None:
    """An upstream that writes more than its answer in one write (a second answer, a 204's
    body): those bytes once joined the answer's head fields, and the connection went back to
    the pool with them half parsed, so the next call read them as its own answer."""
    bogus = b"HTTP/1.1 200 OK\r\nX-Bogus: 1\r\nContent-Length: 7\r\n\r\n"

    answers = [ok(b"first") + bogus]  # one write: parsed in the answer's read

    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answers.pop() if answers else ok(b"second"))
        while True:
            await read_request(reader)
            writer.write(ok(b"second"))

    async with RawServer(extra) as server:
        upstream = Client(server.url, connect_timeout=5)
        first = await upstream.request("GET", "/", [], None)
        assert await first.read(100) == b"first"
        first.release()
        assert await get(upstream) == b"second"
        await upstream.close()
    assert ("X-Bogus", "1") not in first.headers
    assert server.connections == 2


async def test_an_answers_trailer_fields_are_not_head_fields() -> None:
    async def trailered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"2\r\nok\r\n0\r\nX-Trailer: 1\r\n\r\n")  # fmt: skip
        await reader.read()

    async with RawServer(trailered) as server:
        upstream = Client(server.url, connect_timeout=5)
        response = await upstream.request("GET", "/", [], None)
        assert await response.read(100) == b"ok"
        response.release()
        await upstream.close()
    assert response.headers == [("Transfer-Encoding", "chunked")]


async def test_streamed_request_bodies_are_framed_as_declared_or_chunked() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(ok(b""))

    async def parts() -> AsyncIterator[bytes]:
        yield b"one "
        yield b""
        yield b"two"

    async with RawServer(record) as server:
        upstream = Client(server.url, connect_timeout=5)
        for headers in ([], [("Content-Length", "7")]):
            response = await upstream.request("POST", "/p?q=1", headers, parts())
            await response.stream_to(Collect())
            response.release()
        await upstream.close()
    (chunked_head, chunked_body), (sized_head, sized_body) = seen
    assert chunked_head.startswith(b"POST /p?q=1 HTTP/1.1\r\n")
    assert b"Transfer-Encoding: chunked" in chunked_head and b"Host: 127.0.0.1:" in chunked_head
    assert b"Content-Length: 7" in sized_head and b"Transfer-Encoding" not in sized_head
    assert chunked_body == sized_body == b"one two"


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    upstream = Client("http://127.0.0.1:9", connect_timeout=5)
    with pytest.raises(ValueError, match="line breaks"):
        await upstream.request("GET", "/", [("X-A", "1\r\nX-Injected: 1")], None)


async def test_a_refused_connection_says_so() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    upstream = Client(f"http://127.0.0.1:{port}", connect_timeout=5)
    with pytest.raises(
        UpstreamUnavailable, match=re.escape(f"upstream http://127.0.0.1:{port} is unavailable")
    ) as raised:
        await upstream.request("GET", "/", [], None)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


async def test_send_now_writes_the_request_before_it_returns() -> None:
    """What a hang-up's cancel relies on: the request is on the wire when ``send_now`` returns,
    with no turn of the event loop in between (the server here reads it with a blocking call
    from the loop's own thread, so nothing else can run first)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}", connect_timeout=5)
        first = asyncio.ensure_future(get(client))  # opens the connection send_now reuses
        accepted, _ = await asyncio.to_thread(listener.accept)
        with accepted:
            accepted.settimeout(5)
            await asyncio.to_thread(_read_head, accepted)
            accepted.sendall(ok(b"one"))
            assert await first == b"one"
            sent = client.send_now("POST", "/cancel", [], b"{}")
            assert sent is not None
            head = _read_head(accepted)  # blocks the loop: only what send_now wrote is there
            assert head.startswith(b"POST /cancel HTTP/1.1\r\n")
            accepted.sendall(ok(b"two"))
            response = await sent
            assert await response.read(100) == b"two"
            response.release()
        await client.close()
    assert (
        Client(f"http://127.0.0.1:{port}", connect_timeout=5).send_now("GET", "/", [], None) is None
    )


async def test_a_client_that_stops_reading_holds_the_upstream_back() -> None:
    """The proxy relays as fast as the client reads: a stalled client stalls the upstream's
    writes (TCP flow control through the proxy), and the proxy holds only its socket buffers;
    once the client reads again, the whole body arrives intact."""
    total, block = 64 << 20, 64 << 10
    sent = 0
    progress = asyncio.Event()  # set by every block the upstream gets out

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for i in range(total // block):
            writer.write(bytes([i % 251]) * block)
            await writer.drain()
            sent += block
            progress.set()

    async with RawServer(flood) as server, running_proxy(server.url) as proxy:
        client = socket.create_connection(host_port(http_url(proxy)))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        # The upstream's writes stop when the proxy stops reading: a stall is the absence of
        # progress, so it is seen as no block getting out for QUIET_S (woken by each block).
        while sent < total:
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), QUIET_S)
            except TimeoutError:
                break
        assert 0 < sent < 16 << 20, f"the proxy took {sent} bytes from the upstream"

        def read_all() -> bytes:
            chunks, size = [], 0
            with client:
                while size < total + 4096 and (chunk := client.recv(1 << 20)):
                    chunks.append(chunk)
                    size += len(chunk)
                    if (
                        b"\r\n\r\n" in chunks[0]
                        and size - chunks[0].index(b"\r\n\r\n") - 4 >= total
                    ):
                        break
            return b"".join(chunks)

        data = await asyncio.to_thread(read_all)
    body = data.split(b"\r\n\r\n", 1)[1]
    assert len(body) == total
    assert all(body[i * block] == i % 251 for i in range(total // block))
