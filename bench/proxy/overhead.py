"""Benchmark: what the proxy adds, against Envoy and against no proxy at all.

One SSE source (``bench/instruments/sse_source.py``, aiohttp on uvloop) is reached three ways:
direct, through hangup's proxy, and through Envoy (one worker thread, ``bench/harness/envoy.py``).
Clients are raw asyncio connections (HTTP/1.1 written by hand, chunked framing decoded here) so that
the client's own cost stays small and equal for every path. Reported per path:

- ``ttfb``: request written → response head read, for a 2-byte answer: ``--ttfb-calls``
  sequential calls on one keep-alive connection, alone (``@1``) and while 63 other SSE streams
  flow at 100 events/s each (``@64``); ``closed@64``: 64 connections each calling as fast as
  it can (a saturation figure: per-call cost shows up as queueing);
- ``event latency``: the source stamps each SSE event with ``time.monotonic()``; the client
  subtracts it from its own clock on arrival (100 events/s per stream, 1 and 64 streams);
- ``events/s``: streams that send as fast as they can, at 1, 64 and 512 at once, and the proxy
  process's CPU per 1000 events relayed (direct: the source's);
- ``idle stream``: the proxy process's resident memory per open, idle SSE stream (512 streams).

Everything shares the machine's cores (2 here): source, proxy and client compete, which is what a
sidecar sees too. Run: ``.venv/bin/python -m bench.proxy.overhead``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from bench.base.addresses import host_port, port_of
from bench.base.processes import REPO, spawn
from bench.harness.envoy import running_envoy
from bench.instruments.stats import cpu_seconds, median_p99, rss_mib

STAMP = re.compile(rb'"t": ([0-9.]+)')


class Connection:
    """One client connection: write a GET, read the head, then the body's decoded bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: str) -> Connection:
        host, port = host_port(address)
        return cls(*await asyncio.open_connection(host, port, limit=1 << 20))

    async def get(self, path: str) -> bytes:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return head.lower()

    async def body(self, head: bytes, on_data: Callable[[bytes], None]) -> None:
        """Feed the body's bytes to ``on_data`` as they arrive (chunked or Content-Length)."""
        if b"transfer-encoding: chunked" not in head:
            length = int(re.search(rb"content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
            on_data(await self.reader.readexactly(length))
            return
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                return
            on_data(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


async def ttfb(address: str, connections: int, calls: int) -> list[float]:
    times: list[float] = []

    async def loop() -> None:
        conn = await Connection.open(address)
        for _ in range(calls):
            start = time.perf_counter()
            head = await conn.get("/ttfb")
            times.append(1000 * (time.perf_counter() - start))
            await conn.body(head, lambda _: None)
        conn.close()

    await asyncio.gather(*(loop() for _ in range(connections)))
    return times


async def ttfb_under_load(address: str, background: int, calls: int) -> list[float]:
    """TTFB of sequential calls on one connection while ``background`` streams flow (100/s)."""
    stop = asyncio.Event()

    async def stream() -> None:
        conn = await Connection.open(address)
        await conn.get("/events?n=1000000&interval=0.01")
        await stop.wait()
        conn.close()

    streams = [asyncio.ensure_future(stream()) for _ in range(background)]
    try:
        return await ttfb(address, 1, calls)
    finally:
        stop.set()
        await asyncio.gather(*streams)


async def event_latency(address: str, streams: int, events: int) -> list[float]:
    latencies: list[float] = []

    async def one() -> None:
        conn = await Connection.open(address)
        head = await conn.get(f"/events?n={events}&interval=0.01")
        pending = bytearray()

        def on_data(data: bytes) -> None:
            now = time.monotonic()
            pending.extend(data)
            cut = pending.rfind(b"\n\n") + 2
            for stamp in STAMP.findall(bytes(pending[:cut])):
                latencies.append(1000 * (now - float(stamp)))
            del pending[:cut]

        await conn.body(head, on_data)
        conn.close()

    await asyncio.gather(*(one() for _ in range(streams)))
    return latencies


async def saturate(
    address: str,
    streams: int,
    events: int,
    clock: Callable[[], Sequence[float]],
    interval: float = 0.0,
) -> tuple[int, float, list[float]]:
    """Open ``streams`` streams of ``events`` events each; the source starts them all at one
    moment, so what is measured is relaying, not connection setup. Each stream's events follow
    each other as fast as the socket takes them, or ``interval`` seconds apart (paced like
    tokens: each event then reaches the relay alone). Returns the events received,
    the seconds from that moment to the last one, and how much each of ``clock``'s readings
    (CPU seconds of whatever is measured) grew meanwhile."""
    counted = [0]
    begin = time.monotonic() + 1.0 + streams / 250  # time for every stream to be set up

    async def one() -> None:
        conn = await Connection.open(address)
        head = await conn.get(f"/events?n={events}&interval={interval}&start={begin:.6f}")
        tail = bytearray()

        def on_data(data: bytes) -> None:
            tail.extend(data)
            counted[0] += tail.count(b"\n\n")
            del tail[: tail.rfind(b"\n\n") + 2]

        await conn.body(head, on_data)
        conn.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(streams)]
    await asyncio.sleep(max(0.0, begin - time.monotonic()))  # until the agreed start, not a wait
    before, start = clock(), time.monotonic()
    await asyncio.gather(*tasks)
    elapsed, after = time.monotonic() - start, clock()
    return counted[0], elapsed, [a - b for a, b in zip(after, before, strict=True)]


async def throughput(address: str, streams: int, events: int, pid: int) -> tuple[float, float]:
    """(events/s received, CPU ms of process ``pid`` per 1000 events)."""
    count, elapsed, (cpu,) = await saturate(address, streams, events, lambda: [cpu_seconds(pid)])
    return count / elapsed, 1e6 * cpu / count


async def idle_memory(address: str, streams: int, pid: int) -> float:
    """KiB of resident memory per idle open stream in process ``pid``."""
    before = rss_mib(pid)
    conns = [await Connection.open(address) for _ in range(streams)]
    await asyncio.gather(*(c.get("/idle") for c in conns))
    after = rss_mib(pid)
    for c in conns:
        c.close()
    return 1024 * (after - before) / streams


async def measure(name: str, address: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"path": name}
    await ttfb(address, 4, 50)  # warm up pools and code paths
    for n in (1, 64):
        row[f"ttfb@{n}"] = await ttfb_under_load(address, n - 1, args.ttfb_calls)
        row[f"event@{n}"] = await event_latency(address, n, args.events)
    row["closed@64"] = await ttfb(address, 64, args.ttfb_calls // 16)
    for n in (1, 64, 512):
        row[f"rate@{n}"] = await throughput(address, n, args.burst // n, pid)
    row["idle"] = await idle_memory(address, 512, pid) if name != "direct" else None
    return row


def report(rows: list[dict[str, Any]]) -> None:
    direct = rows[0]
    print("ms p50 / p99 (added over direct p50 in brackets)")
    for key in ("ttfb@1", "ttfb@64", "event@1", "event@64", "closed@64"):
        cells = []
        for row in rows:
            added = statistics.median(row[key]) - statistics.median(direct[key])
            cells.append(f"{row['path']}: {median_p99(row[key], 3)} [{added:+.3f}]")
        print(f"  {key:>9}  " + "   ".join(cells))
    print("events/s (CPU ms per 1k events of the relaying process; direct: the source)")
    for n in (1, 64, 512):
        cells = [
            f"{row['path']}: {row[f'rate@{n}'][0]:.0f} ({row[f'rate@{n}'][1]:.1f})" for row in rows
        ]
        print(f"  {n:>4} streams  " + "   ".join(cells))
    cells = [f"{row['path']}: {row['idle']:.1f} KiB" for row in rows if row["idle"] is not None]
    print("memory per idle stream  " + "   ".join(cells))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--ttfb-calls", type=int, default=2000, help="at 1 connection (64: 1/8 each)"
    )
    parser.add_argument("--events", type=int, default=200, help="events per latency stream")
    parser.add_argument("--burst", type=int, default=40000, help="events per throughput level")
    parser.add_argument("--paths", default="direct,hangup,envoy")
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-proxy-overhead"
    with spawn("bench.instruments.sse_source", ["--port", "0"], work / "source") as source:
        port = port_of(source.listeners["http"])
        px_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                   "--log-level", "WARNING",
                   "--upstream-http", source.url(), "--max-concurrent-streams", "0"]  # fmt: skip
        with (
            spawn("proxy", px_args, work / "proxy") as proxy,
            running_envoy(port, work / "envoy") as envoy,
        ):
            targets: dict[str, tuple[str, int]] = {
                "direct": (source.listeners["http"], source.popen.pid),
                "hangup": (proxy.listeners["http"], proxy.popen.pid),
                "envoy": (envoy.address, envoy.popen.pid),
            }
            rows = []
            for name in args.paths.split(","):
                address, pid = targets[name]
                rows.append(await measure(name, address, pid, args))
                print(f"measured {name}", flush=True)
    report(rows)


def run(coro: Coroutine[Any, Any, None]) -> None:
    import uvloop

    uvloop.run(coro)


if __name__ == "__main__":
    run(main())
