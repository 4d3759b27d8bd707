"""An SSE source for the proxy and short-call benchmarks (not a model server): a real aiohttp
server, and :func:`sources`, which starts several sharing one port.

``python -m bench.instruments.sse_source --port 0 --ready-file F``:

- ``GET /ttfb``: 200 with a 2-byte body at once;
- ``GET /events?n=N&interval=S&start=T``: the response head at once, then (from monotonic time
  T, if given) N events ``data: {"i": i, "t": <time.monotonic()>}`` one write each, S seconds
  apart (0: as fast as the socket takes them), then ``data: [DONE]``;
- ``GET /idle``: the response headers, then nothing until the client leaves;
- ``POST /infer``: reads the body, answers at once with a 1 KiB JSON body
  (``bench.short_calls.one_core``: a call of a model that takes no time).

CLOCK_MONOTONIC is shared by processes on one host, so a client can subtract ``t`` from its own
clock to get the event's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop
from aiohttp import web

from bench.base.addresses import port_of
from bench.base.processes import spawn


async def ttfb(_: web.Request) -> web.Response:
    return web.Response(body=b"ok")


async def events(request: web.Request) -> web.StreamResponse:
    n = int(request.query.get("n", "100"))
    interval = float(request.query.get("interval", "0"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    start = float(request.query.get("start", "0"))
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    for i in range(n):
        await response.write(b'data: {"i": %d, "t": %.6f}\n\n' % (i, time.monotonic()))
        if interval:
            await asyncio.sleep(interval)
    await response.write(b"data: [DONE]\n\n")
    return response


_ANSWER = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 150],
                                    "data": [0.5] * 150}]}).encode().ljust(1024)  # fmt: skip


async def infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_ANSWER, content_type="application/json")


async def idle(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.Event().wait()
    return response


async def serve(port: int, ready: Path, reuse_port: bool = False) -> None:
    app = web.Application()
    app.router.add_get("/ttfb", ttfb)
    app.router.add_get("/events", events)
    app.router.add_get("/idle", idle)
    app.router.add_post("/infer", infer)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", port), backlog=4096, reuse_port=reuse_port)
    await web.SockSite(runner, sock).start()
    text = json.dumps({"http": f"127.0.0.1:{sock.getsockname()[1]}"})
    await asyncio.to_thread(ready.write_text, text)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.ready_file, args.reuse_port))


@contextlib.contextmanager
def sources(count: int, work: Path) -> Iterator[tuple[str, list[int]]]:
    """``count`` sources sharing one port (``SO_REUSEPORT``): their address and pids."""
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(
            spawn(
                "bench.instruments.sse_source", ["--port", "0", "--reuse-port"], work / "source-0"
            )
        )
        port = str(port_of(first.listeners["http"]))
        pids = [first.popen.pid]
        for i in range(1, count):
            more = stack.enter_context(spawn("bench.instruments.sse_source",
                                             ["--port", port, "--reuse-port"],
                                             work / f"source-{i}"))  # fmt: skip
            pids.append(more.popen.pid)
        yield first.listeners["http"], pids


if __name__ == "__main__":
    main()
