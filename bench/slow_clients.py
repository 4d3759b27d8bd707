"""Benchmark: slow clients against the proxy and the gateway (real processes, default limits).

``--connections`` clients each open a connection, send a request line and then one header line
every 5 s, never finishing the head (slowloris). Printed: how many connections each process still
holds over time, and what it counted in ``hangup_*_connections_closed_total``.

Run: ``.venv/bin/python -m bench.slow_clients`` (``--connections 3000``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import tempfile
import time
from pathlib import Path

from tests.support.processes import spawn
from tests.support.scrape import metric_sum

MARKS_S = (5, 20, 35, 45)


async def trickle(host: str, port: int, alive: set[asyncio.StreamWriter]) -> None:
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection(host, port)
        alive.add(writer)
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            for i in range(1000):
                await asyncio.sleep(5)
                if reader.at_eof():
                    break
                writer.write(f"X-Slow-{i}: y\r\n".encode())
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    if not await asyncio.wait_for(reader.read(1), 0.001):
                        break  # the server closed it
        finally:
            alive.discard(writer)
            writer.close()


async def attack(name: str, address: str, connections: int) -> None:
    host, port = address.rsplit(":", 1)
    alive: set[asyncio.StreamWriter] = set()
    tasks = [asyncio.create_task(trickle(host, int(port), alive)) for _ in range(connections)]
    started = time.monotonic()
    for mark in MARKS_S:
        await asyncio.sleep(mark - (time.monotonic() - started))
        print(f"  {name}: {len(alive)} of {connections} still open after {mark} s", flush=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=3000)
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
                    asyncio.run(attack(name, address, args.connections))
                    closed = metric_sum(metrics, f"{metric}_connections_closed_total",
                                        reason="header_timeout")  # fmt: skip
                    print(f"  {name}: closed for header_timeout: {closed:.0f}", flush=True)


if __name__ == "__main__":
    main()
