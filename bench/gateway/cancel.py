"""Benchmark: the gateway (simulated engine) at 1, 100 and 1000 concurrent streams.

For each concurrency level: open that many streaming completions, wait until every one has its
first token, measure sustained tokens/s and the gateway's CPU per token over a window, then
cancel streams one at a time through the cancel API while the rest keep streaming. For each
cancel it reports, on one clock (CLOCK_MONOTONIC, shared by both processes):

- ``total``: cancel sent → cancel confirmed (the gateway answers once the engine aborted);
- ``to boundary``: cancel sent → the engine's step boundary that applied the abort (the engine's
  own latency: up to one step, and a step grows with the batch);
- ``boundary→gateway``: that boundary → the gateway's code holding the engine's confirmation
  (the end of ``hangup_gateway_cancel_to_abort_seconds``): the target is p99 < 2 ms;
- ``boundary→caller``: that boundary → the confirmation in the cancel caller's hands (adds the
  HTTP answer, queued behind the batch's token writes in both processes).

Run: ``.venv/bin/python -m bench.gateway.cancel`` (``--levels 1,100`` for a quicker run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

from bench.base.processes import REPO, spawn
from bench.instruments.stats import cpu_seconds, median_p99, rss_mib

MODEL = "hangup-sim"
WIDTHS = (7, 8, 13, 10, 11, 13, 13, 16, 15)


class Stream:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.tokens = 0
        self.first = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self, session: aiohttp.ClientSession, url: str) -> None:
        body = {"model": MODEL, "prompt": "bench", "max_tokens": 4000, "stream": True}
        async with session.post(url, json=body, headers={"X-Request-Id": self.rid}) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"error"' not in line:
                    self.tokens += 1
                    self.first.set()


async def level(base: str, pid: int, n: int, cancels: int, window: float) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        streams = [Stream(f"b{n}-{i}") for i in range(n)]
        for s in streams:
            s.task = asyncio.create_task(s.run(session, f"{base}/v1/completions"))
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 120)
        tokens0, cpu0, t0 = sum(s.tokens for s in streams), cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(window)  # a measurement window, not a wait for an event
        tokens1, cpu1, t1 = sum(s.tokens for s in streams), cpu_seconds(pid), time.monotonic()
        rate = (tokens1 - tokens0) / (t1 - t0)
        sent: dict[str, tuple[float, float]] = {}
        for s in streams[:cancels]:
            start = time.monotonic()
            async with session.post(f"{base}/v2/requests/{s.rid}/cancel") as resp:
                assert resp.status == 200, await resp.text()
            sent[f"{s.rid}-1"] = (start, time.monotonic())
        for s in streams:
            async with session.post(f"{base}/v2/requests/{s.rid}/cancel") as resp:
                await resp.read()
        await asyncio.gather(*(s.task for s in streams if s.task), return_exceptions=True)
    cpu_per_1k = 1e6 * (cpu1 - cpu0) / max(1, tokens1 - tokens0)
    return {"tokens_per_s": rate, "cpu_ms_per_1k_tokens": cpu_per_1k, "rss_mib": rss_mib(pid),
            "sent": sent}  # type: ignore[dict-item]  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,100,1000")
    parser.add_argument("--cancels", type=int, default=100, help="cancels measured per level")
    parser.add_argument("--window", type=float, default=3.0, help="seconds to measure tokens/s")
    args = parser.parse_args()
    work = REPO / ".demo" / "bench"
    head = ["streams", "tok/s", "cpu ms/1k tok", "rss MiB |", "ms p50/p99:", "total",
            "to boundary", "boundary→gateway", "boundary→caller"]  # fmt: skip
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, WIDTHS, strict=True)))
    for n in (int(x) for x in args.levels.split(",")):
        boundary_log = work / f"probe-{n}.jsonl"
        gw_args = [
            *(
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--sim-slots",
                str(n),
                "--log-level",
                "ERROR",
            ),
            *("--sim-step-base", "0.01", "--sim-step-per-seq", "0.0001"),
            *("--probe-log", str(boundary_log)),
        ]
        with spawn("bench.instruments.probe_gateway", gw_args, work) as gw:
            result = await level(gw.url(), gw.popen.pid, n, min(n, args.cancels), args.window)
            gw.terminate()
        records = [json.loads(line) for line in boundary_log.read_text().splitlines()]
        boundaries = {r["id"]: r["boundary"] for r in records}
        confirmed = {r["id"]: r["confirmed"] for r in records}
        sent: dict[str, tuple[float, float]] = result["sent"]  # type: ignore[assignment]
        total = [1000 * (done - start) for start, done in sent.values()]
        to_b = [1000 * (boundaries[k] - s) for k, (s, _) in sent.items()]
        gateway = [1000 * (confirmed[k] - boundaries[k]) for k in sent]
        beyond = [1000 * (d - boundaries[k]) for k, (_, d) in sent.items()]

        cols = [str(n), f"{result['tokens_per_s']:.0f}", f"{result['cpu_ms_per_1k_tokens']:.1f}",
                f"{result['rss_mib']:.1f} |", "",
                *(median_p99(v) for v in (total, to_b, gateway, beyond))]  # fmt: skip
        print(" ".join(f"{c:>{w}}" for c, w in zip(cols, WIDTHS, strict=True)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
