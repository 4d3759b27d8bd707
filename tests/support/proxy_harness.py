"""Running the proxy in-process for adapter-level tests, on 127.0.0.1:0 in the test's event loop.

``running_proxy(upstream_url, **overrides)`` starts a real ``proxy.server.Server`` (HTTP and
admin listeners; with ``worker_of``, as one worker of several) and yields it with its addresses;
leaving the block drains and stops it. Metrics are read back from its own registry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from bench.base.addresses import host_port
from bench.base.waiting import wait_until
from proxy.config import Config
from proxy.server import Server, WorkerOf


@contextlib.asynccontextmanager
async def running_proxy(
    upstream_url: str, worker_of: WorkerOf | None = None, **overrides: Any
) -> AsyncIterator[Server]:
    settings: dict[str, Any] = {
        "http_port": 0,
        "grpc_port": 0,
        "admin_port": 0,
        "upstream_http": upstream_url,
        "drain_timeout": 5.0,
        "cancel_deadline": 5.0,
    }
    settings.update(overrides)
    server = Server(Config(**settings), worker_of=worker_of)
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown()


def http_url(server: Server) -> str:
    return f"http://{server.addresses['http']}"


def metric(server: Server, name: str, **labels: str) -> float:
    value = server.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def wait_metric(
    server: Server, name: str, at_least: float, within: float = 10.0, **labels: str
) -> float:
    """Poll the registry until ``name`` reaches ``at_least`` (it has no change notification)."""
    await wait_until(lambda: metric(server, name, **labels) >= at_least, within, name)
    return metric(server, name, **labels)


async def raw_request(
    address: str, head: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a plain TCP connection and send ``head`` (a request, or the start of one)."""
    host, port = host_port(address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head)
    await writer.drain()
    return reader, writer


async def answer_while_sending(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, chunks: int = 400
) -> bytes:
    """Everything the server sends until it ends the connection, read while this client goes on
    sending a body (``chunks`` of 64 KiB, as long as the server takes them): a client that has
    not noticed its body was refused. The connection is closed after."""

    async def send_the_body() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(chunks):
                writer.write(b"x" * 65536)
                await writer.drain()

    sending = asyncio.ensure_future(send_the_body())
    try:
        return await reader.read()
    finally:
        sending.cancel()
        writer.close()
