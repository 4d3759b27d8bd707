"""The load of ``bench.short_calls.one_core``: unary calls with a 1 KiB JSON body, in a process of
its own.

``python -m bench.short_calls.load --address HOST:PORT --path /infer --concurrency C
--start T0 --end T1 [--rate R] [--keep-alive] [--header 'Name: value' ...]``: C loops, each
making one call after another, each call on a new connection (``--keep-alive``: each loop's calls
on one connection). Without ``--rate`` the loops call as fast as answers come (saturation);
with it, the loops together start R calls a second on a fixed schedule, and a call's latency is
counted from when it was due, not from when it began (a late call is not hidden). Calls that
end between monotonic T0 and T1 (the host's clock, shared with the caller) are counted; then
the process prints one JSON line: ``calls``, ``errors``, its own CPU seconds in the window, and
``latencies`` (seconds, those calls) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import uvloop

from bench.base.addresses import host_port
from bench.instruments.stats import print_json_line

BODY = json.dumps(
    {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [155], "data": [0.25] * 155}],
        "parameters": {"steps": 0},
    }
).encode()
"""The request body: a KServe v2 call with 155 numbers, 1 KiB of JSON (for a real Triton, the
``slow`` model of ``bench/harness/triton/models`` with no steps: it answers at once)."""


class _Window:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.latencies: list[float] = []
        self.errors = 0

    def ended(self, due: float, now: float) -> None:
        if self.start <= now < self.end:
            self.latencies.append(now - due)


def request(host: str, path: str, headers: list[str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
            f"Content-Length: {len(BODY)}", *headers]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + BODY


async def _answer(reader: asyncio.StreamReader) -> bool:
    """Read one answer; whether it was a 200 (a body by length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = head[9:12]
    fields = head.lower()
    at = fields.find(b"\r\ncontent-length:")
    if at >= 0:
        length = int(fields[at + 17 : fields.index(b"\r\n", at + 2)])
        await reader.readexactly(length)
    elif b"transfer-encoding: chunked" in fields:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status == b"200"


async def _calls(
    address: tuple[str, int], payload: bytes, keep: bool, every: float, phase: float, w: _Window
) -> None:
    """One loop: a call, then the next (``every`` seconds apart from ``phase`` when paced)."""
    due = phase
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while True:
        now = time.monotonic()
        if now >= w.end:
            break
        if every:
            await asyncio.sleep(max(0.0, due - now))
        else:
            due = now
        try:
            if connection is None:
                connection = await asyncio.open_connection(*address)
            reader, writer = connection
            writer.write(payload)
            ok = await _answer(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            ok = False
            connection = None
        if ok:
            w.ended(due, time.monotonic())
        elif w.start <= time.monotonic() < w.end:
            w.errors += 1
        if connection is not None and (not keep or not ok):
            connection[1].close()
            connection = None
        due += every
    if connection is not None:
        connection[1].close()


async def load(args: argparse.Namespace) -> dict[str, object]:
    host, port = host_port(args.address)
    payload = request(host, args.path, args.header)
    window = _Window(args.start, args.end)
    every = args.concurrency / args.rate if args.rate else 0.0
    first = time.monotonic() + 0.05
    phases = [first + i * every / args.concurrency for i in range(args.concurrency)]
    address = (host, port)
    loops = [
        asyncio.ensure_future(_calls(address, payload, args.keep_alive, every, phase, window))
        for phase in phases
    ]
    await asyncio.sleep(max(0.0, args.start - time.monotonic()))  # the agreed moment
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, args.end - time.monotonic()))
    cpu = time.process_time() - cpu0
    _, pending = await asyncio.wait(loops, timeout=5.0)
    for task in pending:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    return {
        "calls": len(window.latencies),
        "errors": window.errors,
        "cpu": cpu,
        "latencies": [round(v, 7) for v in window.latencies],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--path", default="/infer")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=0.0, help="calls a second (0: saturate)")
    parser.add_argument("--start", type=float, required=True, help="monotonic time")
    parser.add_argument("--end", type=float, required=True, help="monotonic time")
    parser.add_argument("--keep-alive", action="store_true", help="each loop on one connection")
    parser.add_argument("--header", action="append", default=[], help="another request header")
    args = parser.parse_args()
    print_json_line(uvloop.run(load(args)))


if __name__ == "__main__":
    main()
