"""The load of ``bench.scaling.cores``: streaming calls, each on a new connection, in a process of
its own (several run side by side where one core cannot drive the relay).

``python -m bench.scaling.load --address HOST:PORT[,HOST:PORT...] --kind sse|completions
--concurrency C --events E --start T0 --end T1 [--keep-alive]``: C loops (spread over the
addresses in turn), each making one call after another,
each call on a new connection (with ``--keep-alive``: each loop's calls on one connection, as a
client with a connection pool makes them): ``sse`` asks an SSE source (through a relay) for E events
(``GET /events?n=E``), ``completions`` asks a gateway for a streaming completion of E tokens.
Events (``\\n\\n``-terminated SSE events) are counted as they arrive. At monotonic time T0 (the
clock is the host's, shared with the caller) counting starts, at T1 it stops and the process
prints one JSON line: ``events`` and ``calls`` begun in the window, its own CPU seconds and
``sleeps`` (how often it waited for data: each time, a wakeup) in the window, and ``ports``, the
local port of every call open in the window (the caller maps them to the process that accepted
each: how the kernel spread the connections; with ``--keep-alive``, of every connection). Then
it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import resource
import time
import typing

import uvloop

from bench.base.addresses import host_port
from bench.instruments.stats import print_json_line

_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked response


class _Counts:
    def __init__(self) -> None:
        self.events = 0
        self.calls = 0  # begun in the window
        self.spans: list[tuple[int, float, float]] = []  # (local port, opened, closed)
        self.counting = False


class _Call(asyncio.Protocol):
    """One call: write the request, count the events of the answer, close at its end (or, when
    ``keep``, keep the connection for the next call: :meth:`again`)."""

    def __init__(
        self, request: bytes, counts: _Counts, done: asyncio.Future[None], keep: bool = False
    ) -> None:
        self._request = request
        self._counts = counts
        self._done = done
        self._keep = keep
        self._tail = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.Transport, transport)  # uvloop's: not a subclass
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        joined = self._tail + data  # an event's end may straddle two reads
        self._counts.events += joined.count(b"\n\n") - self._tail.count(b"\n\n")
        self._tail = joined[-8:]
        if not self._tail.endswith(_END) or self._transport is None:
            return
        if not self._keep:
            self._transport.close()
        elif not self._done.done():
            self._tail = b""
            self._done.set_result(None)

    def again(self, done: asyncio.Future[None]) -> None:
        """The next call on the same connection (``keep``): ``done`` when its answer ends."""
        assert self._transport is not None
        self._done = done
        self._transport.write(self._request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


def _sleeps() -> int:
    """How often this process has waited for something (voluntary context switches): each
    time, the next event that arrives has to wake it."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _same(call: _Call) -> _Call:
    return call


def request(kind: str, host: str, events: int) -> bytes:
    if kind == "sse":
        return f"GET /events?n={events} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    body = json.dumps(
        {
            "model": "hangup-sim",
            "prompt": "bench",
            "max_tokens": events,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _kept(address: tuple[str, int], payload: bytes, counts: _Counts, end: float) -> None:
    """Calls one after another on one connection (``--keep-alive``)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    call = _Call(payload, counts, done, keep=True)
    opened = time.monotonic()
    transport, _ = await loop.create_connection(functools.partial(_same, call), *address)
    try:
        counts.calls += counts.counting
        await done
        while time.monotonic() < end and not transport.is_closing():
            done = loop.create_future()
            counts.calls += counts.counting
            call.again(done)
            await done
    finally:
        counts.spans.append((transport.get_extra_info("sockname")[1], opened, time.monotonic()))
        transport.close()


async def _loop(address: tuple[str, int], payload: bytes, counts: _Counts, end: float) -> None:
    loop = asyncio.get_running_loop()
    while time.monotonic() < end:
        done: asyncio.Future[None] = loop.create_future()
        call = _Call(payload, counts, done)
        opened = time.monotonic()
        transport, _ = await loop.create_connection(functools.partial(_same, call), *address)
        counts.calls += counts.counting
        try:
            await done
        finally:
            port = transport.get_extra_info("sockname")[1]
            counts.spans.append((port, opened, time.monotonic()))


async def load(args: argparse.Namespace) -> dict[str, object]:
    addresses = [host_port(address) for address in args.address.split(",")]
    counts = _Counts()
    payload = request(args.kind, addresses[0][0], args.events)
    calls = _kept if args.keep_alive else _loop
    loops = [
        asyncio.ensure_future(calls(addresses[i % len(addresses)], payload, counts, args.end))
        for i in range(args.concurrency)
    ]
    await asyncio.sleep(max(0.0, args.start - time.monotonic()))  # the agreed moment
    events0, cpu0, sleeps0 = counts.events, time.process_time(), _sleeps()
    counts.counting = True
    await asyncio.sleep(max(0.0, args.end - time.monotonic()))
    counts.counting = False
    events, cpu, sleeps = counts.events - events0, time.process_time() - cpu0, _sleeps() - sleeps0
    for task in loops:
        task.cancel()  # the calls still open end here: their spans close at the window's end
    await asyncio.gather(*loops, return_exceptions=True)
    ports = [
        port for port, opened, closed in counts.spans if opened < args.end and closed > args.start
    ]
    return {"events": events, "calls": counts.calls, "cpu": cpu, "sleeps": sleeps, "ports": ports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True, help="HOST:PORT, or several comma-separated")
    parser.add_argument("--kind", choices=["sse", "completions"], default="sse")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--start", type=float, required=True, help="monotonic time")
    parser.add_argument("--end", type=float, required=True, help="monotonic time")
    parser.add_argument("--keep-alive", action="store_true", help="each loop on one connection")
    args = parser.parse_args()
    print_json_line(uvloop.run(load(args)))


if __name__ == "__main__":
    main()
