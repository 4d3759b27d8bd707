"""The chaos soak's TCP forwarder (``bench/harness/faults.py``) leaves no socket behind when it
closes, whatever its connections were doing: a socket left to the garbage collector fails a
later, unrelated test with an unclosed-socket warning (CI saw it three times)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from bench.base.addresses import host_port
from bench.base.waiting import wait_until
from bench.harness.faults import Forwarder


def _connect(address: str) -> socket.socket:
    host, port = host_port(address)
    client = socket.create_connection((host, port))
    client.settimeout(10)  # a bound, not a wait: the forwarder's side closes at once or never
    return client


def _closed_by_peer(client: socket.socket) -> bool:
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_close_racing_an_accept_closes_that_connection() -> None:
    """A connection accepted in the loop turn before ``close()``: Python 3.11 makes its transport
    one turn later, and a stream server closed meanwhile lets that transport's creation fail
    silently, its socket left open. The forwarder must stop accepting before it closes."""
    forwarder = Forwarder("127.0.0.1:9")  # never reached: the connection is not relayed
    client = _connect(await forwarder.start())  # in the listener's backlog once this returns
    try:
        await asyncio.sleep(0)  # the turn in which the loop sees the listener readable,
        await asyncio.sleep(0)  # and this one, in which it accepts, after this coroutine's step
        await forwarder.close()
        assert await asyncio.to_thread(_closed_by_peer, client), "the forwarder kept it open"
    finally:
        client.close()


async def test_close_resets_a_relayed_connection() -> None:
    """A connection relaying to its upstream: ``close()`` ends it on both sides."""
    received = bytearray()
    upstream_ended = asyncio.Event()

    async def upstream_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(64):
                received.extend(data)
        writer.close()
        upstream_ended.set()

    upstream = await asyncio.start_server(upstream_side, "127.0.0.1", 0)
    forwarder = Forwarder(f"127.0.0.1:{upstream.sockets[0].getsockname()[1]}")
    client = _connect(await forwarder.start())
    try:
        client.sendall(b"through")
        await wait_until(lambda: bytes(received) == b"through", what="the bytes relayed")
        await forwarder.close()
        assert await asyncio.to_thread(_closed_by_peer, client)
        await wait_until(upstream_ended.is_set, what="the upstream side ended")
    finally:
        client.close()
        upstream.close()
