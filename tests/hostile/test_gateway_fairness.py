"""Fair shares, attacked on a live gateway (simulated engine): one client or one call floods the
engine's admission queue or the background-response store while a victim's call is timed.

A client is whom ``--client-header`` names (behind the sidecar: the last element of
``X-Forwarded-For``, the address the proxy saw), else the connection's address: the tests set
the header as the sidecar would, so each test's attacker and victim are different clients (or,
where it says so, one address with many calls). docs/security.md, "Fair shares".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.base.waiting import wait_until
from bench.harness.stack import running_stack
from gateway_server.engine.sim.config import SimConfig
from tests.support.gateway import MODEL, Gateway, running_gateway

QUICK = SimConfig(slots=8, step_base_s=0.002, step_per_seq_s=0.0, prefill_per_token_s=0.0)
BEHIND_SIDECAR = {"client_header": "x-forwarded-for"}


def sidecar_saw(address: str) -> dict[str, str]:
    """The header the sidecar sends for a client at ``address`` that wrote its own first."""
    return {"X-Forwarded-For": f"203.0.113.9, {address}"}


def waiting(gw: Gateway) -> int:
    return sum(w.engine.load().waiting for w in gw.server.pool.workers)


async def timed_completion(gw: Gateway, headers: dict[str, str]) -> float:
    """A 5-token completion's seconds, failing past 10 s (the flood takes minutes)."""
    start = time.monotonic()
    async with asyncio.timeout(10):
        async with gw.session.post(
            f"{gw.url}/v1/completions",
            json={"model": MODEL, "prompt": "victim", "max_tokens": 5},
            headers=headers,
        ) as resp:
            body = await resp.json()
    assert resp.status == 200, body
    assert body["usage"]["completion_tokens"] == 5
    return time.monotonic() - start


@pytest.fixture
async def flooder() -> AsyncIterator[aiohttp.ClientSession]:
    """The attacker's own client: no connection limit, closed when it leaves."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def test_a_clients_1600_requests_do_not_delay_another_clients_completion(
    flooder: aiohttp.ClientSession,
) -> None:
    """Was: the engine's queue was FIFO: a victim waited behind every request queued before
    its own (here 1,600: about a minute). Now the queue serves clients in turn, and the
    attacker's queued work is cancelled when it leaves (it is not background work)."""
    async with running_gateway(sim=QUICK, **BEHIND_SIDECAR) as gw:
        body = {"model": MODEL, "prompt": "flood", "n": 16, "max_tokens": 40}

        async def flood_call() -> None:
            url = f"{gw.url}/v1/completions"
            async with flooder.post(url, json=body, headers=sidecar_saw("10.0.0.1")) as resp:
                await resp.read()

        calls = [asyncio.create_task(flood_call()) for _ in range(100)]
        try:
            await wait_until(lambda: waiting(gw) >= 1_500, within=30, what="the flood queued")
            took = await timed_completion(gw, sidecar_saw("10.0.0.2"))
            # FIFO, the victim's request would have been admitted after the whole flood
            assert waiting(gw) >= 500, "the victim was served after the flood, not beside it"
            assert took < 5.0, f"the victim's 5 tokens took {took:.1f} s"
        finally:
            left = waiting(gw)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await flooder.close()  # the attacker leaves: its queued requests are cancelled
        await wait_until(
            lambda: gw.requests("cancelled") >= left, within=30, what="the flood cancelled"
        )
        assert waiting(gw) == 0


async def test_one_addresss_100_calls_delay_its_other_call_by_a_turn_each(
    flooder: aiohttp.ClientSession,
) -> None:
    """Without a header naming clients (every call from one address, as behind the sidecar
    without --client-header) the queue still serves calls in turn: a completion waits for one
    request of each of the 100 flooding calls, not for their 1,600. (One ModelStreamInfer
    stream's own cap: tests/hostile/test_gateway_grpc.py; one call of 20,000 requests in the
    engine's queue: tests/hostile/test_sim_engine.py.)"""
    async with running_gateway(sim=QUICK) as gw:
        body = {"model": MODEL, "prompt": "flood", "n": 16, "max_tokens": 40}

        async def flood_call() -> None:
            async with flooder.post(f"{gw.url}/v1/completions", json=body) as resp:
                await resp.read()

        calls = [asyncio.create_task(flood_call()) for _ in range(100)]
        try:
            await wait_until(lambda: waiting(gw) >= 1_500, within=30, what="the flood queued")
            took = await timed_completion(gw, {})
            assert waiting(gw) >= 500, "the victim was served after the flood, not beside it"
            assert took < 5.0, f"the victim's 5 tokens took {took:.1f} s"
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        await wait_until(lambda: waiting(gw) == 0, within=30, what="the flood cancelled")


async def background(gw: Gateway, session: aiohttp.ClientSession, address: str | None,
                     tokens: int) -> tuple[int, dict[str, Any]]:  # fmt: skip
    headers = sidecar_saw(address) if address else {}
    body = {"model": MODEL, "input": "x", "max_output_tokens": tokens, "background": True}
    async with session.post(f"{gw.url}/v1/responses", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_one_client_cannot_take_every_background_slot() -> None:
    """Was: one client took all 1,000 background slots in 0.6 s and every other client got
    429. Now a client holds at most --responses-background-per-client of them."""
    one_slot = SimConfig(slots=1, step_base_s=0.005)
    store = {"responses_max_stored": 20, "responses_background_per_client": 5,
             "drain_timeout": 0.0}  # fmt: skip
    async with running_gateway(sim=one_slot, **store, **BEHIND_SIDECAR) as gw:
        taken = [await background(gw, gw.session, "10.0.0.1", 2000) for _ in range(5)]
        assert [status for status, _ in taken] == [200] * 5
        status, refused = await background(gw, gw.session, "10.0.0.1", 2000)
        assert status == 429, refused
        assert "--responses-background-per-client" in refused["error"]["message"]
        status, victim = await background(gw, gw.session, "10.0.0.2", 1)
        assert status == 200, victim
    async with running_gateway(sim=one_slot, **store) as gw:  # no header: one address
        statuses = [(await background(gw, gw.session, None, 2000))[0] for _ in range(6)]
        assert statuses == [200] * 5 + [429]


async def test_one_client_storing_responses_never_pushes_out_another_clients() -> None:
    """Was: stored responses shared one count, the oldest dropped first: a client storing
    1,000 one-token responses (the default total) dropped every other client's, and the
    victim's GET and its previous_response_id answered 404. Now a client keeps at most
    --responses-stored-per-client (100) of them, its own oldest dropped first."""
    async with running_gateway(sim=QUICK, **BEHIND_SIDECAR) as gw:
        url = f"{gw.url}/v1/responses"
        body = {"model": MODEL, "input": "x", "max_output_tokens": 1}

        async def store(address: str) -> str:
            async with gw.session.post(url, json=body, headers=sidecar_saw(address)) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
                return str(answer["id"])

        victim = await store("10.0.0.2")
        flood: list[str] = []
        for _ in range(20):  # 1,000 in all, 50 at a time
            flood += await asyncio.gather(*(store("10.0.0.1") for _ in range(50)))

        async def status(response_id: str) -> int:
            async with gw.session.get(f"{url}/{response_id}") as resp:
                return resp.status

        assert await status(victim) == 200, "the victim's stored response was pushed out"
        assert [await status(flood[i]) for i in (0, 899, 900, 999)] == [404, 404, 200, 200]
        follow_up = body | {"previous_response_id": victim}
        async with gw.session.post(url, json=follow_up, headers=sidecar_saw("10.0.0.2")) as r:
            assert r.status == 200, await r.text()


async def test_a_departed_clients_background_work_runs_without_holding_the_queue(
    flooder: aiohttp.ClientSession,
) -> None:
    """Was: a client's queued background responses (992 of ~4,090 tokens) held the FIFO queue
    against everyone after it left. They still run (they outlive their client), in its turn."""
    two_slots = SimConfig(slots=2, step_base_s=0.002, step_per_seq_s=0.0)
    async with running_gateway(sim=two_slots, drain_timeout=0.0, **BEHIND_SIDECAR) as gw:
        made = [await background(gw, flooder, "10.0.0.1", 100) for _ in range(20)]
        assert all(status == 200 for status, _ in made)
        await flooder.close()  # the attacker leaves
        await wait_until(lambda: waiting(gw) >= 17, what="its background responses queued")
        took = await timed_completion(gw, sidecar_saw("10.0.0.2"))
        assert waiting(gw) >= 10, "the victim was served after the background work"
        assert took < 5.0, f"the victim's 5 tokens took {took:.1f} s"
        async with gw.session.get(f"{gw.url}/v1/responses/{made[-1][1]['id']}") as resp:
            assert (await resp.json())["status"] in ("queued", "in_progress")


async def test_behind_the_real_sidecar_a_client_is_the_address_it_saw(tmp_path: Path) -> None:
    """The chart's choice, end to end: the proxy appends its client's address to
    X-Forwarded-For, so a client behind it cannot take another's share by writing the header
    (two clients on loopback, from 127.0.0.2 and 127.0.0.3)."""
    gateway_args = ["--client-header", "x-forwarded-for", "--responses-background-per-client",
                    "2", "--sim-slots", "1", "--drain-timeout", "0"]  # fmt: skip
    with running_stack(tmp_path, gateway_args) as stack:
        body = {"model": MODEL, "input": "x", "max_output_tokens": 2000, "background": True}

        async def start(source: str, forged: str | None = None) -> int:
            headers = {"X-Forwarded-For": forged} if forged else {}
            connector = aiohttp.TCPConnector(local_addr=(source, 0))
            url = f"{stack.proxy_url}/v1/responses"
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.post(url, json=body, headers=headers) as resp,
            ):
                await resp.read()
                return resp.status

        assert [await start("127.0.0.2") for _ in range(2)] == [200, 200]
        assert await start("127.0.0.2", forged="127.0.0.3") == 429  # the proxy's word is last
        assert await start("127.0.0.3") == 200
