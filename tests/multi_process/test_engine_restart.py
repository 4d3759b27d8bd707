"""A dead engine comes back, with the real processes: the gateway (``--sim-faults``) behind the
proxy, and the gateway with two API processes. The fault switch kills a simulated worker as
SIGKILL kills a vLLM engine core."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.stack import MODEL, TOKEN, in_flight, running_stack

AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAULTS = ["--sim-faults", "--sim-step-base", "0.005"]
LONG = {"model": MODEL, "prompt": "long", "max_tokens": 4000, "stream": True}


async def kill(session: aiohttp.ClientSession, gateway_url: str, worker: str) -> int:
    async with session.post(f"{gateway_url}/v2/admin/workers/{worker}/fault",
                            json={"fault": "kill"}, headers=AUTH) as resp:  # fmt: skip
        await resp.read()
        return resp.status


async def first_event(resp: aiohttp.ClientResponse) -> None:
    while not (await resp.content.readline()).startswith(b"data: "):
        pass


async def test_through_the_proxy_a_killed_worker_fails_its_stream_and_comes_back(
    tmp_path: Path,
) -> None:
    with running_stack(tmp_path, [*FAULTS, "--workers", "2"]) as stack:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"{stack.proxy_url}/v1/completions", json=LONG)
            assert resp.status == 200
            await first_event(resp)
            (call_id,) = await in_flight(session, stack.gateway_url)
            before = await scrape_async(session, stack.gateway_url)
            victim = next(w for w in ("0", "1") if total(
                before, "hangup_gateway_engine_running_requests", worker=w))  # fmt: skip

            assert await kill(session, stack.gateway_url, victim) == 200
            rest = [line async for line in resp.content if line.startswith(b"data: ")]
            assert b"[DONE]" not in rest[-1] and f"engine worker {victim}".encode() in rest[-1]
            cancel = f"{stack.gateway_url}/v2/requests/{call_id}/cancel"
            async with asyncio.timeout(5), session.post(cancel, headers=AUTH) as answer:
                assert (answer.status, (await answer.json())["state"]) == (200, "finished")

            async def restarted() -> bool:
                samples = await scrape_async(session, stack.gateway_url)
                return total(samples, "hangup_gateway_engine_restarts_total", worker=victim) == 1

            await wait_until(restarted, what="the restart counted")
            samples = await scrape_async(session, stack.gateway_url)
            assert total(samples, "hangup_gateway_worker_up") == 2
            assert await in_flight(session, stack.gateway_url) == {}
            body = {"model": MODEL, "prompt": "again", "max_tokens": 3}
            async with session.post(f"{stack.proxy_url}/v1/completions", json=body) as again:
                assert again.status == 200, await again.text()
        log = stack.gateway.log()
        assert '"engine_worker_died"' in log and "simulated engine killed" in log
        assert '"engine_worker_restarted"' in log


async def test_with_api_processes_a_restart_counts_gateway_wide(tmp_path: Path) -> None:
    args = [*FAULTS, "--workers", "2", "--api-processes", "2"]
    with running_stack(tmp_path, args) as stack:
        fresh = aiohttp.TCPConnector(force_close=True)  # each request may land on either process
        async with aiohttp.ClientSession(connector=fresh) as session:
            # The worker answers through the process that runs it (404 from the other).
            await wait_until(lambda: _killed(session, stack.gateway_url, "1"),
                             what="the fault to reach worker 1's process")  # fmt: skip

            async def restarted() -> bool:
                samples = await scrape_async(session, stack.gateway_url)
                counted = total(samples, "hangup_gateway_engine_restarts_total", worker="1")
                return counted == 1 and total(samples, "hangup_gateway_worker_up") == 2

            await wait_until(restarted, what="worker 1 restarted and both up, on any process")
            samples = await scrape_async(session, stack.gateway_url)
            assert total(samples, "hangup_gateway_engine_restarts_total", worker="0") == 0
            for _ in range(4):  # whichever process answers
                async with session.get(f"{stack.gateway_url}/v2/health/live") as live:
                    assert live.status == 200


async def _killed(session: aiohttp.ClientSession, url: str, worker: str) -> bool:
    status = await kill(session, url, worker)
    assert status in (200, 404), status
    return status == 200
