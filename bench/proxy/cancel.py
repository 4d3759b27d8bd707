"""Benchmark: client hang-up → engine abort, direct to the gateway, through hangup's proxy and
through Envoy, with the same workload in one run.

The gateway runs with a probe engine (``bench/instruments/probe_gateway.py``: the normal gateway and
simulated engine, recording per aborted request when the abort was asked for, which step
boundary applied it and how many tokens it had generated). For each path, ``--calls`` streaming
completions run ``--concurrency`` at a time; each client reads a seeded random number of tokens,
drops its connection (an RST, sent by ``close()`` on the client's own socket with
SO_LINGER 0, so no event-loop turn of the client is in the figure) and notes the time on
CLOCK_MONOTONIC (shared with the gateway process).
Per hang-up:

- ``to abort asked``: hang-up → the engine was asked to abort (what the path between the client
  and the engine adds: hangup's target is p99 < 5 ms beyond the engine's step boundary);
- ``to boundary``: hang-up → the step boundary that applied the abort (adds the engine's own
  wait for the step in progress: up to one step);
- ``tokens after``: tokens the engine generated for the request after the client left (the
  generated count at the abort minus the tokens the client had read).

Direct and Envoy rely on the gateway noticing the closed connection itself (hangup's gateway
does; many model servers do not); the proxy makes an explicit cancel call.

Run: ``.venv/bin/python -m bench.proxy.cancel`` (``--calls 100`` for a quicker run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import struct
import time

from bench.base.addresses import host_port, port_of
from bench.base.processes import REPO, spawn
from bench.harness.envoy import running_envoy
from bench.instruments.stats import quantile

MODEL = "hangup-sim"


async def hang_up_after(url: str, rid: str, tokens: int) -> tuple[str, float, int]:
    """Stream a completion, read ``tokens`` tokens, hang up: (id, when, tokens read)."""
    body = json.dumps({"model": MODEL, "prompt": "bench", "max_tokens": 3000, "stream": True})
    host, port = host_port(url)
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    seen = 0
    while seen < tokens:
        line = await reader.readline()
        if not line:
            raise RuntimeError(f"{rid}: stream ended early")
        if line.startswith(b"data: {"):
            seen += 1
    # The transport's abort() closes the socket only on this loop's next turn, which would put
    # the benchmark client's own lag into every path's figure: close the socket now instead,
    # with SO_LINGER 0 (an RST, sent before close() returns), once abort() has unregistered it.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    left = time.monotonic()
    sock.close()
    return rid, left, seen


async def run_path(
    url: str, name: str, calls: int, concurrency: int, seed: int
) -> dict[str, tuple[float, int]]:
    rng = random.Random(seed)
    plan = [(f"{name}-{i}", rng.randint(2, 20)) for i in range(calls)]
    slots = asyncio.Semaphore(concurrency)

    async def one(rid: str, tokens: int) -> tuple[str, float, int]:
        async with slots:
            return await hang_up_after(url, rid, tokens)

    results = await asyncio.gather(*(one(rid, n) for rid, n in plan))
    return {rid: (left, seen) for rid, left, seen in results}


def summarise(
    name: str, hangups: dict[str, tuple[float, int]], probe: dict[str, dict[str, float]]
) -> str:
    asked, boundary, after = [], [], []
    for rid, (left, seen) in hangups.items():
        record = probe.get(f"{rid}-1")
        if record is None or record.get("requested") is None:
            continue
        asked.append(1000 * (record["requested"] - left))
        boundary.append(1000 * (record["boundary"] - left))
        after.append(int(record["generated"]) - seen)
    missing = len(hangups) - len(asked)
    return (
        f"{name:>8} {len(asked):>6} {missing:>8} "
        f"{statistics.median(asked):8.2f} {quantile(asked, 0.99):8.2f} "
        f"{statistics.median(boundary):8.2f} {quantile(boundary, 0.99):8.2f} "
        f"{statistics.mean(after):7.2f} {int(quantile(after, 0.99)):5d} {max(after):5d}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="hang-ups per path")
    parser.add_argument("--concurrency", type=int, default=32, help="streams at once")
    parser.add_argument("--step", type=float, default=0.01, help="engine step base, seconds")
    parser.add_argument("--paths", default="direct,hangup,envoy")
    parser.add_argument("--proxy-args", default="", help="extra proxy flags, space-separated")
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-proxy-cancel"
    probe_log = work / "probe.jsonl"
    token = work / "token"
    work.mkdir(parents=True, exist_ok=True)
    token.write_text("bench-token")
    gw_args = [
        "--http-port", "0", "--grpc-port", "0", "--log-level", "ERROR",
        "--cancel-token-file", str(token),
        "--sim-slots", str(args.concurrency * 2), "--sim-step-base", str(args.step),
        "--sim-step-per-seq", "0.0001", "--probe-log", str(probe_log),
    ]  # fmt: skip
    results: dict[str, dict[str, tuple[float, int]]] = {}
    with spawn("bench.instruments.probe_gateway", gw_args, work / "gateway") as gateway:
        port = port_of(gateway.listeners["http"])
        px_args = [
            "--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--log-level", "WARNING",
            "--upstream-http", gateway.url(), "--trust-client-request-id",
            "--cancel-token-file", str(token), *args.proxy_args.split(),
        ]  # fmt: skip
        with (
            spawn("proxy", px_args, work / "proxy") as proxy,
            running_envoy(port, work / "envoy") as envoy,
        ):
            urls = {"direct": gateway.url(), "hangup": proxy.url(), "envoy": envoy.url}
            for seed, name in enumerate(args.paths.split(",")):
                results[name] = await run_path(urls[name], name, args.calls, args.concurrency, seed)
        gateway.terminate()
    probe = {r["id"]: r for r in map(json.loads, probe_log.read_text().splitlines())}
    print(
        f"engine step {1000 * args.step:.0f} ms (+0.1 ms per sequence); "
        f"{args.concurrency} streams at once"
    )
    print(f"{'path':>8} {'calls':>6} {'missing':>8} {'asked p50':>8} {'p99':>8} "
          f"{'bound p50':>8} {'p99':>8} "
          f"{'tok mean':>7} {'p99':>5} {'max':>5}")  # fmt: skip
    for name, hangups in results.items():
        print(summarise(name, hangups, probe))


if __name__ == "__main__":
    asyncio.run(main())
