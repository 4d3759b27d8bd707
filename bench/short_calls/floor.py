"""Benchmark: how far hangup's per-call CPU is from the least a Python relay can spend.

Kept-alive short calls (``bench.short_calls.load``: 1 KiB JSON in and out, an upstream that
answers at once, 16 client loops), no CPU quota, one process each, in one run:

- **the floor**: a relay of a few dozen lines, written here (:class:`_FloorDown`), that does
  what no relay can skip and nothing else: uvloop, httptools parsing both ways, one upstream
  connection per client connection, the request forwarded with a fresh ``X-Request-Id``, the
  answer relayed as the bytes that came (no header rewriting, no limits, no metrics, no
  hang-up handling). It is a measuring stick, not a proxy;
- **the floor with a task per call**: the same, each call run by a task through three nested
  coroutines that await the upstream's answer (what an asyncio handler structure costs);
- **hangup's proxy** (``--workers 1``) and **Envoy** (``--concurrency 1``).

Prints the proxy's CPU µs per call for each, a line per round. Run:
``.venv/bin/python -m bench.short_calls.floor`` (about a minute; Envoy's row is skipped when
its binary is missing). The floor subprocess is this module run with ``--floor UPSTREAM``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable

import httptools
import uvloop

from bench.harness.envoy import envoy_binary
from bench.harness.processes import REPO
from bench.harness.sse_source import sources
from bench.scaling.relays import envoy_relay, proxy_relay
from bench.short_calls.free import window

# --- the floor relay (run in a process of its own) -------------------------------------------


class _FloorUp(asyncio.Protocol):
    """The upstream side of one client connection: an answer's bytes, handed on at its end."""

    def __init__(self, done: Callable[[bytes], None]) -> None:
        self._done = done
        self._parser = httptools.HttpResponseParser(self)
        self._parts: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._parts.append(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        answer = b"".join(self._parts)
        self._parts.clear()
        self._done(answer)


class _FloorDown(asyncio.Protocol):
    """One client connection: requests parsed, forwarded one at a time, answers written back."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)
    tasks = False  # run each call in a task (the second row)

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[bytes] = deque()
        self._busy = False
        self._up: _FloorUp | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[bytes] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._url = b""
        self._body = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._up is not None and self._up.transport is not None:
            self._up.transport.close()

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._body = b""

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        request = b"POST %b HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n" % (
            self._url
        ) + b"X-Request-Id: %b\r\nContent-Length: %d\r\n\r\n%b" % (
            os.urandom(16).hex().encode(),
            len(self._body),
            self._body,
        )
        if self.tasks:
            self._calls.add(asyncio.get_running_loop().create_task(self._serve(request)))
            return
        self._queue.append(request)
        self._pump()

    def _pump(self) -> None:
        if self._busy or not self._queue:
            return
        self._busy = True
        self._send(self._queue.popleft())

    def _send(self, request: bytes) -> None:
        if self._up is not None and self._up.transport is not None:
            self._up.transport.write(request)
            return
        loop = asyncio.get_running_loop()

        async def connect() -> None:
            _, self._up = await loop.create_connection(
                lambda: _FloorUp(self._answered), *self.upstream
            )
            assert self._up.transport is not None
            self._up.transport.write(request)

        self._connecting = loop.create_task(connect())

    def _answered(self, answer: bytes) -> None:
        if self._waiter is not None:
            self._waiter.set_result(answer)
            return
        assert self.transport is not None
        self.transport.write(answer)
        self._busy = False
        self._pump()

    async def _serve(self, request: bytes) -> None:  # three frames, as a handler's would be
        await self._handle(request)

    async def _handle(self, request: bytes) -> None:
        await self._relay(request)

    async def _relay(self, request: bytes) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        self._send(request)
        answer = await self._waiter
        self._waiter = None
        assert self.transport is not None
        self.transport.write(answer)
        self._calls.discard(asyncio.current_task())


async def _floor(upstream: str, tasks: bool) -> None:
    host, port = upstream.rsplit(":", 1)
    _FloorDown.upstream, _FloorDown.tasks = (host, int(port)), tasks
    server = await asyncio.get_running_loop().create_server(_FloorDown, "127.0.0.1", 0)
    print(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# --- the measurement -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per row")
    parser.add_argument("--floor", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        uvloop.run(_floor(args.floor, args.tasks))
        return
    work = REPO / ".demo" / "bench-short-calls-floor"
    with contextlib.ExitStack() as stack:
        upstream, _ = stack.enter_context(sources(1, work))
        rows: list[tuple[str, str, list[int]]] = []
        for name, extra in (("floor", []), ("floor, a task per call", ["--tasks"])):
            floor = subprocess.Popen(
                [sys.executable, "-m", "bench.short_calls.floor", "--floor", upstream, *extra],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            stack.callback(floor.wait)
            stack.callback(floor.kill)
            assert floor.stdout is not None
            rows.append((name, floor.stdout.readline().strip(), [floor.pid]))
        proxy = proxy_relay(stack, 1, upstream, work)
        rows.append(("hangup", proxy.address, [p for group in proxy.groups for p in group]))
        if envoy_binary().exists():
            envoy = envoy_relay(stack, 1, upstream, work, 0)
            rows.append(("Envoy", envoy.address, [p for group in envoy.groups for p in group]))
        for _ in range(args.rounds):
            for name, address, pids in rows:
                output, cpu = window(address, True, 16, args.window, pids)
                calls, errors = int(str(output["calls"])), output["errors"]
                us = 1e6 * cpu / max(1, calls)
                rate = calls / args.window
                print(f"{name}: {us:.0f} µs of CPU per kept-alive call "
                      f"({rate:,.0f} calls/s, {errors} errors)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
