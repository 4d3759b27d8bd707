"""The chaos soak's TCP forwarder (``tests/support/faults.py``) leaves no socket behind when it
closes, whatever its connections were doing: a socket left to the garbage collector fails a
later, unrelated test with an unclosed-socket warning (CI saw it three times)."""

from __future__ import annotations

import asyncio
import socket

from tests.support.faults import Forwarder


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    client = socket.create_connection((host, int(port)))
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
    upstream = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    forwarder = Forwarder(f"127.0.0.1:{port}")
    client = _connect(await forwarder.start())
    try:
        client.sendall(b"through")
        await forwarder.close()
        assert await asyncio.to_thread(_closed_by_peer, client)
    finally:
        client.close()
        upstream.close()
