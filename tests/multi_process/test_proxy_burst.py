"""A burst of 200 mixed calls through the proxy to the real gateway, half of whose clients hang up
at random points (seeded): afterwards nothing is in flight on the gateway, every hang-up is
counted exactly once on both sides, and every completed response is what the gateway sends.

"What the gateway sends" is checked by replaying each completed call straight to the gateway
and comparing the bodies byte for byte after normalising the two fields that differ by design
between two calls: the call id and the ``created`` timestamp.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from bench.base.scrape import scrape_async, total
from bench.base.waiting import POLL_INTERVAL, wait_until
from bench.harness.stack import MODEL, Stack, in_flight, running_stack

CALLS = 200
SEED = 20261122


@dataclass(frozen=True)
class Plan:
    rid: str
    path: str
    body: dict[str, Any]
    hang_up: bool
    after_tokens: int  # hang up once the gateway has generated this many tokens (or events seen)


def plans() -> list[Plan]:
    rng = random.Random(SEED)
    out = []
    for i in range(CALLS):
        chat, stream, hang_up = rng.random() < 0.5, rng.random() < 0.5, i % 2 == 0
        prompt = " ".join(
            rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(1, 40))
        )
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 3000 if hang_up else rng.randint(1, 24),
        }
        body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        body["stream"] = stream
        path = "/v1/chat/completions" if chat else "/v1/completions"
        out.append(Plan(f"burst-{i}", path, body, hang_up, rng.randint(0, 8)))
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    gateway = ["--sim-slots", "64", "--sim-step-base", "0.01"]
    with running_stack(
        tmp_path_factory.mktemp("burst"), gateway, ["--trust-client-request-id"]
    ) as running:
        yield running


class GatewayWatch:
    """One poller of the gateway's call list, shared by every hang-up waiting on a token count."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.tokens: dict[str, int] = {}
        self.changed = asyncio.Condition()

    async def run(self) -> None:
        while True:
            calls = await in_flight(self.session, self.url)
            async with self.changed:
                self.tokens = {rid: int(c["generated_tokens"]) for rid, c in calls.items()}
                self.changed.notify_all()
            await asyncio.sleep(POLL_INTERVAL)  # the call list has no change notification

    async def wait_tokens(self, rid: str, at_least: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.tokens.get(rid, -1) >= at_least)


async def run_call(
    client: aiohttp.ClientSession, url: str, plan: Plan, watch: GatewayWatch
) -> bytes | None:
    headers = {"X-Request-Id": plan.rid}
    if not plan.hang_up:
        async with client.post(url + plan.path, json=plan.body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.read()
    if plan.body["stream"]:
        resp = await client.post(url + plan.path, json=plan.body, headers=headers)
        for _ in range(plan.after_tokens):
            assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
        resp.close()  # the hang-up: the connection is dropped mid-stream
        return None
    call = asyncio.ensure_future(client.post(url + plan.path, json=plan.body, headers=headers))
    await watch.wait_tokens(plan.rid, plan.after_tokens)
    call.cancel()  # the hang-up: aiohttp drops the connection while waiting for the answer
    with pytest.raises(asyncio.CancelledError):
        await call
    return None


def normalise(body: bytes, rid: str) -> bytes:
    return re.sub(rb'"created": ?\d+', b'"created": 0', body.replace(rid.encode(), b"<id>"))


@pytest.mark.slow
async def test_burst_of_200_with_half_hanging_up(stack: Stack) -> None:
    work = plans()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as client:
        watch = GatewayWatch(client, stack.gateway_url)
        poller = asyncio.ensure_future(watch.run())
        try:
            results = await asyncio.gather(
                *(run_call(client, stack.proxy_url, p, watch) for p in work)
            )
        finally:
            poller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await poller
        await wait_until(
            lambda: _idle(client, stack), within=30, what="nothing in flight on the gateway"
        )

        hang_ups = sum(p.hang_up for p in work)
        proxy_cancels = "hangup_proxy_cancel_calls_total"

        async def all_answered() -> bool:
            return total(await scrape_async(client, stack.admin_url), proxy_cancels) >= hang_ups

        await wait_until(all_answered, within=30, what="every cancel call answered")
        px = await scrape_async(client, stack.admin_url)
        gw = await scrape_async(client, stack.gateway_url)
        assert total(px, "hangup_proxy_client_disconnects_total") == hang_ups
        assert total(px, "hangup_proxy_requests_total", outcome="cancelled") == hang_ups
        assert total(px, "hangup_proxy_requests_total", outcome="completed") == CALLS - hang_ups
        assert total(px, proxy_cancels) == hang_ups
        assert (
            total(px, proxy_cancels, result="gave_up")
            == total(px, proxy_cancels, result="error")
            == 0
        )
        assert total(gw, "hangup_gateway_cancellations_total") == hang_ups
        assert (
            total(gw, "hangup_gateway_cancellations_total", reason="client_disconnect") == hang_ups
        )
        assert total(gw, "hangup_gateway_requests_total", outcome="cancelled") == hang_ups
        assert total(gw, "hangup_gateway_requests_total", outcome="completed") == CALLS - hang_ups

        completed = [(p, r) for p, r in zip(work, results, strict=True) if not p.hang_up]
        direct = await asyncio.gather(*(replay(client, stack, plan) for plan, _ in completed))
        for (plan, relayed), (direct_id, sent) in zip(completed, direct, strict=True):
            assert relayed is not None
            assert normalise(relayed, plan.rid) == normalise(sent, direct_id), plan


async def replay(client: aiohttp.ClientSession, stack: Stack, plan: Plan) -> tuple[str, bytes]:
    """The same call straight to the gateway, under an id of its own."""
    direct_id = plan.rid + "-direct"
    headers = {"X-Request-Id": direct_id}
    async with client.post(stack.gateway_url + plan.path, json=plan.body, headers=headers) as resp:
        return direct_id, await resp.read()


async def _idle(client: aiohttp.ClientSession, stack: Stack) -> bool:
    return not await in_flight(client, stack.gateway_url)
