"""Benchmark: with the real vLLM engine, do streams leave token by token, and does every hang-up
become a cancellation? Hundreds of streams per setup, sequential and concurrent.

Three runs, each against fresh processes with the same engine options (by default vLLM's, with
``--enforce-eager --kv-cache-memory-bytes 268435456`` as a CPU needs):

1. **sequential**: ``--streams`` streaming completions (400 tokens, ``ignore_eos``), one at a
   time, 0.2 s apart. Setups: hangup's gateway direct, through ``hangup-proxy``, and vLLM's own
   OpenAI server direct (what ``vllm serve`` runs). Per stream: the time to its first content
   event, and whether it was *held*: fewer than 80 % of its tokens arrived as events of their
   own (a stream held back until generation ends arrives as one event).
2. **hang-ups**: ``--streams`` times through ``hangup-proxy``: stream, read 5 events, close the
   socket (an RST at once), wait until the gateway has nothing in flight, and read
   ``hangup_gateway_cancellations_total``: a hang-up not counted there is *lost*.
3. **concurrent**: ``--streams`` streaming chat completions, 8 at a time, through
   ``hangup-proxy``; half of the clients hang up 0.3 s after sending (AIPerf's cancellation
   test). Hang-ups against the gateway's ``client_disconnect`` cancellations; held streams among
   the others.

Run: ``.venv/bin/python -m bench.vllm.streams`` (``--streams 300``; ``--workers 2``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.base.addresses import host_port
from bench.base.processes import Process, spawn
from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.vllm_stack import MODEL, make_tiny_model, vllm_serve

ENGINE_ARGS = ["--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20)]
SEQUENTIAL_TOKENS = 400
HELD_SHARE = 0.8
CONCURRENCY = 8
HANG_UP_AFTER_S = 0.3


@dataclass
class StreamStats:
    ttfb: list[float] = field(default_factory=list)
    held: int = 0
    streams: int = 0

    def row(self, name: str) -> str:
        t = sorted(self.ttfb)
        p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
        return (f"| {name} | {self.streams} | {self.held} | {statistics.median(t) * 1e3:.1f} / "
                f"{p99 * 1e3:.0f} / {t[-1] * 1e3:.0f} |")  # fmt: skip


async def timed_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], chat: bool
) -> tuple[float | None, int, int]:
    """(seconds to the first content event, content events, tokens) of one streaming call."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    sent, first, events, tokens = time.perf_counter(), None, 0, 0
    async with session.post(url + path, json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            choice = event["choices"][0] if event["choices"] else {}
            if (choice.get("delta") or {}).get("content") or choice.get("text"):
                events += 1
                first = first or time.perf_counter() - sent
    return first, events, tokens


async def sequential(url: str, streams: int) -> StreamStats:
    stats = StreamStats()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": SEQUENTIAL_TOKENS,
            "ignore_eos": True}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for _ in range(streams):
            first, events, tokens = await timed_stream(session, url, body, chat=False)
            assert first is not None and tokens == SEQUENTIAL_TOKENS, (first, tokens)
            stats.ttfb.append(first)
            stats.streams += 1
            stats.held += events < HELD_SHARE * tokens
            await asyncio.sleep(0.2)
    return stats


async def cancellations(session: aiohttp.ClientSession, gateway: str) -> float:
    samples = await scrape_async(session, gateway)
    return total(samples, "hangup_gateway_cancellations_total", reason="client_disconnect")


async def wait_nothing_in_flight(session: aiohttp.ClientSession, gateway: str) -> None:
    async def idle() -> bool:
        async with session.get(gateway + "/v2/requests") as response:
            return not (await response.json())["requests"]

    await wait_until(idle, 120.0, "the gateway to have no calls in flight")


async def hang_up_after_events(proxy: str, events: int) -> None:
    """Stream through ``proxy``, read ``events`` events, then reset the connection."""
    host, port = host_port(proxy)
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400,
                       "stream": True, "ignore_eos": True})  # fmt: skip
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())  # fmt: skip
    seen = 0
    while seen < events:
        line = await reader.readline()
        if not line:
            raise RuntimeError("the stream ended before the client hung up")
        seen += line.startswith(b"data: {")
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def hang_ups(gateway: str, proxy: str, streams: int) -> tuple[int, int]:
    """(hang-ups, hang-ups the gateway did not count as a cancellation)."""
    lost = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(streams):
            before = await cancellations(session, gateway)
            await hang_up_after_events(proxy, 5)
            await wait_nothing_in_flight(session, gateway)
            lost += await cancellations(session, gateway) - before != 1
    return streams, lost


async def concurrent(gateway: str, proxy: str, streams: int) -> dict[str, int]:
    rng = random.Random(11)
    counts = {"hung_up": 0, "completed": 0, "held": 0}
    slots = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        before = await cancellations(session, gateway)

        async def one() -> None:
            message = {"role": "user", "content": "hello " * rng.randint(5, 200)}
            body = {"model": MODEL, "max_tokens": rng.randint(100, 400), "ignore_eos": True,
                    "messages": [message]}  # fmt: skip
            call = timed_stream(session, proxy, body, chat=True)
            async with slots:
                if rng.random() < 0.5:
                    try:
                        await asyncio.wait_for(call, HANG_UP_AFTER_S)
                    except TimeoutError:
                        counts["hung_up"] += 1
                        return
                else:
                    _, events, tokens = await call
                    counts["held"] += events < HELD_SHARE * tokens
                counts["completed"] += 1

        await asyncio.gather(*(one() for _ in range(streams)))
        await wait_nothing_in_flight(session, gateway)
        counts["cancellations"] = int(await cancellations(session, gateway) - before)
    return counts


@contextlib.contextmanager
def hangup(model: Path, tmp: Path, workers: int) -> Iterator[tuple[Process, Process]]:
    args = ["--engine", "vllm", "--model", str(model), "--served-model-name", MODEL,
            "--workers", str(workers), "--http-port", "0", "--grpc-port", "0",
            *ENGINE_ARGS]  # fmt: skip
    with spawn("gateway_server", args, tmp / "gateway", timeout=600) as gateway:
        proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                      "--upstream-http", gateway.url()]  # fmt: skip
        with spawn("proxy", proxy_args, tmp / "proxy", timeout=60) as proxy:
            yield gateway, proxy
            proxy.terminate()
        gateway.terminate(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", type=Path, help="a model directory (default: a fresh tiny one)")
    args = parser.parse_args()
    n = args.streams
    with tempfile.TemporaryDirectory(prefix="hangup-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model = args.model or make_tiny_model(tmp / "tiny")
        rows = []
        with hangup(model, tmp, args.workers) as (gateway, proxy):
            print(f"hangup, {args.workers} worker(s): sequential, hang-ups, concurrent", flush=True)
            rows.append(asyncio.run(sequential(gateway.url(), n)).row("hangup gateway"))
            rows.append(asyncio.run(sequential(proxy.url(), n)).row("hangup gateway + proxy"))
            lost = asyncio.run(hang_ups(gateway.url(), proxy.url(), n))
            mixed = asyncio.run(concurrent(gateway.url(), proxy.url(), n))
        print("vLLM's OpenAI server: sequential", flush=True)
        with vllm_serve(model, tmp, ENGINE_ARGS) as url:
            rows.append(asyncio.run(sequential(url, n)).row("vLLM server"))
    print("\n| setup | streams | held | first event ms, p50 / p99 / max |\n|---|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nhang-ups after 5 events through the proxy: {lost[0]}, lost {lost[1]}")
    print(f"concurrent ({CONCURRENCY} at a time, half hang up after {HANG_UP_AFTER_S} s): "
          f"{mixed['hung_up']} hung up, {mixed['cancellations']} client_disconnect cancellations "
          f"on the gateway; {mixed['completed']} completed, {mixed['held']} held")  # fmt: skip


if __name__ == "__main__":
    main()
