"""The gateway (simulated engine) and the proxy in front of it, as real processes on 127.0.0.1:0,
and the ways tests read them: Prometheus text from ``/metrics``, the gateway's call list, raw
client connections that can hang up at any byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import host_port
from bench.base.processes import Process, spawn

MODEL = "hangup-sim"
TOKEN = "proxy-test-token"


@dataclass
class Stack:
    gateway: Process
    proxy: Process

    @property
    def proxy_url(self) -> str:
        return self.proxy.url("http")

    @property
    def gateway_url(self) -> str:
        return self.gateway.url("http")

    @property
    def admin_url(self) -> str:
        return self.proxy.url("admin")


@contextlib.contextmanager
def running_stack(
    tmp: Path, gateway_args: Sequence[str], proxy_args: Sequence[str] = ()
) -> Iterator[Stack]:
    token = tmp / "cancel-token"
    tmp.mkdir(parents=True, exist_ok=True)
    token.write_text(TOKEN)
    common = ["--cancel-token-file", str(token)]
    gw_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", *common, *gateway_args]
    with spawn("gateway_server", gw_args, tmp / "gateway") as gateway:
        # API processes with ports of their own (--grpc-process-ports): the proxy spreads over them
        grpc = gateway.listeners.get("grpc_processes") or gateway.listeners["grpc"]
        args = [
            "--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", gateway.url("http"), "--upstream-grpc", grpc,
            *common, *proxy_args,
        ]  # fmt: skip
        with spawn("proxy", args, tmp / "proxy") as proxy:
            yield Stack(gateway, proxy)


async def in_flight(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with session.get(gateway_url + "/v2/requests", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return {r["request_id"]: r for r in (await resp.json())["requests"]}


def completion_request(
    path: str, body: dict[str, Any], *, request_id: str | None = None, host: str = "model"
) -> bytes:
    """A complete HTTP/1.1 request with a JSON body, as a client would write it."""
    payload = json.dumps(body).encode()
    extra = f"X-Request-Id: {request_id}\r\n" if request_id else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{extra}\r\n"
    )
    return head.encode() + payload


class RawClients:
    """Client connections a test opens and hangs up on at will (``writer.close()``); every one
    still open is closed when the test ends, however it ends (the ``raw`` fixture)."""

    def __init__(self) -> None:
        self._writers: list[asyncio.StreamWriter] = []

    async def open(
        self, url: str, data: bytes
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``url`` that has sent ``data``."""
        host, port = host_port(url)
        reader, writer = await asyncio.open_connection(host, port)
        self._writers.append(writer)
        writer.write(data)
        await writer.drain()
        return reader, writer

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        for writer in self._writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._writers.clear()
