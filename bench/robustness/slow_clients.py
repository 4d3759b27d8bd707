"""Benchmark: slow clients against the proxy and the gateway (real processes, default limits).

``--connections`` clients each open a connection and then stall:

- ``--stall head`` (slowloris): a request line, then one header line every 5 s, never finishing
  the head (cut by ``--header-timeout``, 30 s);
- ``--stall body``: a whole head declaring a 1,000-byte body, 4 bytes of it, then nothing (cut
  by ``--body-timeout``, 60 s, with a 408; the connection closes after up to 10 s of lingering,
  so the client reads the answer first).

Printed: how many connections each process still holds over time, and what it counted in
``hangup_*_connections_closed_total``.

Run: ``.venv/bin/python -m bench.robustness.slow_clients`` (``--connections 3000 --stall head``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import tempfile
import time
from pathlib import Path

from bench.base.addresses import host_port
from bench.base.processes import spawn
from bench.base.scrape import metric_sum

MARKS_S = {"head": (5, 20, 35, 45), "body": (5, 50, 65, 80, 90)}
REASON = {"head": "header_timeout", "body": "body_timeout"}
STALLED_BODY = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 1000\r\n\r\n{"mo'
)


async def trickle(host: str, port: int, alive: set[asyncio.StreamWriter], stall: str) -> None:
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection(host, port)
        alive.add(writer)
        try:
            if stall == "body":
                writer.write(STALLED_BODY)
            else:
                writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            for i in range(1000):
                await asyncio.sleep(5)
                if reader.at_eof():
                    break
                if stall == "head":
                    writer.write(f"X-Slow-{i}: y\r\n".encode())
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    while await asyncio.wait_for(reader.read(65536), 0.001):
                        pass  # the server's answer (a 408 or 503), if any
                    break  # then end of file: the server closed it
        finally:
            alive.discard(writer)
            writer.close()


async def attack(name: str, address: str, connections: int, stall: str) -> None:
    host, port = host_port(address)
    alive: set[asyncio.StreamWriter] = set()
    tasks = [asyncio.create_task(trickle(host, port, alive, stall))
             for _ in range(connections)]  # fmt: skip
    started = time.monotonic()
    for mark in MARKS_S[stall]:
        await asyncio.sleep(mark - (time.monotonic() - started))
        print(f"  {name}: {len(alive)} of {connections} still open after {mark} s", flush=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--stall", choices=sorted(MARKS_S), default="head")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * args.connections + 1024), hard))
    with tempfile.TemporaryDirectory(prefix="hangup-slow-") as tmp_name:
        tmp = Path(tmp_name)
        with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], tmp / "g") as gw:
            proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                          "--upstream-http", gw.url()]  # fmt: skip
            with spawn("proxy", proxy_args, tmp / "p") as px:
                for name, address, metrics, metric in (
                    ("proxy", px.listeners["http"], px.url("admin"), "hangup_proxy"),
                    ("gateway", gw.listeners["http"], gw.url(), "hangup_gateway"),
                ):
                    asyncio.run(attack(name, address, args.connections, args.stall))
                    reason = REASON[args.stall]
                    closed = metric_sum(metrics, f"{metric}_connections_closed_total",
                                        reason=reason)  # fmt: skip
                    print(f"  {name}: closed for {reason}: {closed:.0f}", flush=True)


if __name__ == "__main__":
    main()
