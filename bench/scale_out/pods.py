"""Scale out: several hangup pods behind a real Envoy, and what an Endpoint Picker's scrape costs.

Part 1 (``make demo-scale``, and the benchmark): three pods (a gateway with the simulated engine
and a proxy in front of it, as the chart's pod), a real Envoy balancing over their proxies with
least-request (the Endpoint Picker's stand-in), and a burst of mixed calls through it, half of
the clients hanging up at random points (``bench/harness/scale_out.py``). Prints a table of what
each pod did and what Envoy saw, and the CPU each part spent.

Part 2 (``--scrape-cost``): the EPP scrapes each pod's ``/metrics`` every 50 ms, through the
proxy. For one gateway (``--workers 2``) with one and with two API processes: the latency of a
scrape through the proxy, the CPU one scrape costs the gateway and the proxy (idle pod, scrapes
back to back), and the token path: the gaps between events of 32 streams with and without a
scraper at 20 Hz.

Run: ``.venv/bin/python -m bench.scale_out.pods`` (``--calls``, ``--pods``, ``--scrape-cost``).
Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.base.processes import descendants
from bench.base.scrape import Samples, total
from bench.base.waiting import wait_until
from bench.harness.scale_out import (
    in_flight,
    logged,
    plan,
    run_burst,
    running_pods,
    scrape_all,
)
from bench.harness.stack import MODEL, Stack, running_stack
from bench.instruments.stats import cpu_of, median_p99, quantile

GATEWAY = ["--workers", "2", "--sim-slots", "16", "--sim-step-base", "0.02"]


def say(text: str = "") -> None:
    print(text, flush=True)


async def burst(calls: int, pods: int, concurrency: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, running_pods(Path(tmp), pods, GATEWAY) as stack:
        pids = {
            "envoy": [stack.envoy.popen.pid],
            "proxies": [p.proxy.popen.pid for p in stack.pods],
            "gateways": [q for p in stack.pods
                         for q in (p.gateway.popen.pid, *descendants(p.gateway.popen.pid))],
        }  # fmt: skip
        cpu_before = {name: cpu_of(group) for name, group in pids.items()}
        plan_ = plan(calls, seed)
        say(f"{calls} calls ({sum(c.hang_up for c in plan_)} hanging up at random points), "
            f"{concurrency} at a time, through Envoy (least-request) over {pods} pods")  # fmt: skip
        seconds = await run_burst(stack.envoy.url, plan_, concurrency, seed)
        await _settled(stack.pods)
        cpu = {name: cpu_of(group) - cpu_before[name] for name, group in pids.items()}
        gateways, proxies = await scrape_all(stack.pods)
        left = await in_flight(stack.pods)
        envoy = stack.envoy.stats()
        at_gateway, _ = logged(stack.pods)

    hang_ups = [c.request_id for c in plan_ if c.hang_up]
    reached = sum(rid in at_gateway for rid in hang_ups)
    whole = sum(1 for c in plan_ if not c.hang_up and c.problem is None)
    say(f"took {seconds:.1f} s; completed calls whole: {whole} of {calls - len(hang_ups)}\n")
    say(
        "| pod | engine requests | completed | cancelled (client left) | of them queued "
        "| tokens | wasted | proxy: disconnects | cancel ok / not_found | in flight after |"
    )
    say("|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for i, (g, p) in enumerate(zip(gateways, proxies, strict=True)):
        say(f"| {i} | {total(g, 'hangup_gateway_requests_total'):.0f} "
            f"| {total(g, 'hangup_gateway_requests_total', outcome='completed'):.0f} "
            f"| {total(g, 'hangup_gateway_cancellations_total', reason='client_disconnect'):.0f} "
            f"| {_queued(g):.0f} "
            f"| {total(g, 'hangup_gateway_generated_tokens_total'):.0f} "
            f"| {total(g, 'hangup_gateway_wasted_tokens_total'):.0f} "
            f"| {total(p, 'hangup_proxy_client_disconnects_total'):.0f} "
            f"| {total(p, 'hangup_proxy_cancel_calls_total', result='ok'):.0f} / "
            f"{total(p, 'hangup_proxy_cancel_calls_total', result='not_found'):.0f} "
            f"| {left[i]} |")  # fmt: skip
    cancelled = sum(total(g, "hangup_gateway_cancellations_total") for g in gateways)
    say(
        f"\nEnvoy: {envoy.get('http.bench.downstream_rq_total', 0)} requests, "
        f"{envoy.get('http.bench.downstream_rq_rx_reset', 0)} reset by their client; "
        f"hang-ups {len(hang_ups)}, reached a gateway {reached}, cancelled there {cancelled:.0f}"
    )
    say("CPU seconds: " + ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())
        + f" ({1e3 * sum(cpu.values()) / calls:.1f} ms per call, all parts)")  # fmt: skip


async def _settled(pods: list[Stack]) -> None:
    """Until no pod has anything in flight (30 s at most; the table then shows what is left)."""
    with contextlib.suppress(AssertionError):
        await wait_until(lambda: _idle(pods), within=30, what="every pod idle")


async def _idle(pods: list[Stack]) -> bool:
    return sum(await in_flight(pods)) == 0


def _queued(samples: Samples) -> float:
    """Cancels in the queued phase: most came before their request (the proxy's cancel left a
    tombstone), the rest while it waited for a batch slot."""
    return total(samples, "hangup_gateway_cancellations_total", phase="queued")


async def scrape_cost(scrapes: int) -> None:
    say(
        "| gateway | path | scrape through the proxy, ms p50/p99 | gateway CPU per scrape, ms "
        "| proxy CPU per scrape, ms | event gap p99 of 32 streams, ms: no scraper / 20 Hz |"
    )
    say("|---|---|---|---|---|---|")
    for processes in (1, 2):
        args = [*GATEWAY, "--api-processes", str(processes)]
        with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp), args) as pod:
            gateway = [pod.gateway.popen.pid, *descendants(pod.gateway.popen.pid)]
            proxy = [pod.proxy.popen.pid]
            quiet = await _stream_gaps(pod.proxy_url, None)
            for path in ("/metrics", "/metrics/pool"):
                url = pod.proxy_url + path
                async with aiohttp.ClientSession() as session:
                    for _ in range(20):  # warm: connections, first renders
                        await _get(session, url)
                    before = cpu_of(gateway), cpu_of(proxy)
                    latencies = [await _get(session, url) for _ in range(scrapes)]
                    gateway_ms = 1e3 * (cpu_of(gateway) - before[0]) / scrapes
                    proxy_ms = 1e3 * (cpu_of(proxy) - before[1]) / scrapes
                scraped = await _stream_gaps(pod.proxy_url, url)
                gaps = f"{quantile(quiet, 0.99) * 1e3:.1f} / {quantile(scraped, 0.99) * 1e3:.1f}"
                say(f"| --api-processes {processes} | `{path}` "
                    f"| {median_p99([x * 1e3 for x in latencies])} "
                    f"| {gateway_ms:.2f} | {proxy_ms:.2f} | {gaps} |")  # fmt: skip


async def _get(session: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with session.get(url) as resp:
        await resp.read()
    return time.perf_counter() - started


async def _stream_gaps(proxy: str, scrape_url: str | None) -> list[float]:
    """Gaps between events of 32 streams of 200 tokens, a scraper at 20 Hz beside them."""
    body = {"model": MODEL, "prompt": "gaps", "max_tokens": 200, "stream": True}
    gaps: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def stream() -> None:
            async with session.post(proxy + "/v1/completions", json=body) as resp:
                last = None
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        last = now

        async def scraper() -> None:
            assert scrape_url is not None
            while not done.is_set():
                await _get(session, scrape_url)
                await asyncio.sleep(0.05)

        task = asyncio.create_task(scraper()) if scrape_url else None
        await asyncio.gather(*(stream() for _ in range(32)))
        done.set()
        if task is not None:
            await task
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--scrape-cost", action="store_true", help="part 2 as well")
    parser.add_argument("--scrapes", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(burst(args.calls, args.pods, args.concurrency, args.seed))
    if args.scrape_cost:
        say()
        asyncio.run(scrape_cost(args.scrapes))


if __name__ == "__main__":
    main()
