"""Cancelling through the API in every phase, early cancels, auth, and clients that hang up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.sim.config import SimConfig
from tests.support.gateway import MODEL, Gateway, running_gateway

ONE_SLOT = SimConfig(slots=1, step_base_s=0.005)


@pytest.fixture
async def one_slot() -> AsyncIterator[Gateway]:
    async with running_gateway(sim=ONE_SLOT) as gw:
        yield gw


async def start_stream(
    gw: Gateway, rid: str, prompt: str = "x", max_tokens: int = 4000
) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    resp = await gw.session.post(
        f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": rid}
    )
    assert resp.status == 200
    return resp


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    """Every ``data:`` payload until the server ends the stream."""
    return [line.decode()[6:].strip() async for line in resp.content if line.startswith(b"data: ")]


async def test_cancel_in_decode(gateway: Gateway) -> None:
    resp = await start_stream(gateway, "dec")
    await resp.content.readline()  # the first token arrived: decoding
    status, body = await gateway.cancel("dec")
    assert status == 200
    assert body["state"] == "cancelled" and body["phase"] == "decode"
    assert body["request_id"] == "dec" and body["generated_tokens"] >= 1
    events = await read_events(resp)
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["type"] == "cancelled"
    assert gateway.cancellations("explicit", "decode") == 1
    assert gateway.requests("cancelled") == 1
    assert gateway.metric("hangup_gateway_cancel_to_abort_seconds_count", model=MODEL) == 1
    wasted = gateway.metric("hangup_gateway_wasted_tokens_total", model=MODEL)
    assert wasted == gateway.metric("hangup_gateway_generated_tokens_total", model=MODEL) >= 1
    assert await gateway.in_flight() == {}


async def test_cancel_in_prefill() -> None:
    sim = SimConfig(prefill_chunk_tokens=8, step_base_s=0.005)
    async with running_gateway(sim=sim) as gw:
        resp = await start_stream(gw, "pre", prompt="word " * 3000, max_tokens=100)
        await wait_until(lambda: gw.phase_of("pre"), what="the request to be in flight")
        await wait_until(lambda: _is(gw.phase_of("pre"), "prefill"), what="prefill")
        status, body = await gw.cancel("pre", reason="client_disconnect")
        assert (status, body["phase"], body["generated_tokens"]) == (200, "prefill", 0)
        await read_events(resp)
        assert gw.cancellations("client_disconnect", "prefill") == 1
        assert gw.metric("hangup_gateway_generated_tokens_total", model=MODEL) == 0


async def _is(phase: asyncio.Future[str | None] | object, expected: str) -> bool:
    return (await phase) == expected  # type: ignore[misc]


async def test_cancel_while_queued_and_the_slot_goes_to_the_next(one_slot: Gateway) -> None:
    gw = one_slot
    running = await start_stream(gw, "run")
    await running.content.readline()
    queued = asyncio.create_task(_complete(gw, "queued-1", max_tokens=3))
    waiting = asyncio.create_task(_complete(gw, "queued-2", max_tokens=3))
    await wait_until(lambda: _both_queued(gw), what="two queued requests")
    status, body = await gw.cancel("queued-1")
    assert (status, body["phase"]) == (200, "queued")
    assert (await queued)[0] == 499
    assert gw.cancellations("explicit", "queued") == 1
    # The running request still holds the only slot; cancelling it admits the next in line.
    await gw.cancel("run")
    await read_events(running)
    status, answer = await waiting
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
    assert gw.cancellations("explicit", "decode") == 1 and gw.requests("completed") == 1


async def _both_queued(gw: Gateway) -> bool:
    flight = await gw.in_flight()
    return all(flight.get(r, {}).get("phase") == "queued" for r in ("queued-1", "queued-2"))


async def _complete(gw: Gateway, rid: str, max_tokens: int) -> tuple[int, dict[str, object]]:
    body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens}
    async with gw.session.post(
        f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": rid}
    ) as r:
        return r.status, await r.json()


async def test_cancel_that_arrives_first_wins(gateway: Gateway) -> None:
    status, body = await gateway.cancel("early", reason="client_disconnect")
    assert status == 404 and "early" in body["error"]
    status, answer = await _complete(gateway, "early", max_tokens=5)
    assert status == 499
    assert "cancelled (client_disconnect) before it arrived" in answer["error"]["message"]  # type: ignore[index]
    assert gateway.cancellations("client_disconnect", "queued") == 1
    assert gateway.metric("hangup_gateway_generated_tokens_total", model=MODEL) == 0


async def test_cancel_is_idempotent_and_unknown_ids_are_404(gateway: Gateway) -> None:
    resp = await start_stream(gateway, "twice")
    await resp.content.readline()
    first, second = await asyncio.gather(gateway.cancel("twice"), gateway.cancel("twice"))
    assert first[0] == second[0] == 200
    await read_events(resp)
    status, body = await gateway.cancel("twice")
    assert (status, body["state"]) == (200, "finished")
    assert gateway.cancellations("explicit", "decode") == 1
    status, _ = await gateway.cancel("never-was")
    assert status == 404


async def test_finished_request_cancel_says_finished(gateway: Gateway) -> None:
    assert (await _complete(gateway, "quick", max_tokens=2))[0] == 200
    status, body = await gateway.cancel("quick")
    assert (status, body["state"], body["generated_tokens"]) == (200, "finished", 2)
    assert gateway.requests("cancelled") == 0


async def test_bad_cancel_bodies(gateway: Gateway) -> None:
    url = f"{gateway.url}/v2/requests/x/cancel"
    for data, needle in (
        (b"{", "not valid JSON"),
        (b'{"reason": "bored"}', "unknown reason 'bored'"),
    ):
        async with gateway.session.post(url, data=data) as r:
            assert r.status == 400 and needle in (await r.json())["error"]


async def test_token_is_required_when_configured() -> None:
    async with running_gateway(token="s3cret") as gw:
        url = f"{gw.url}/v2/requests/abc/cancel"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            async with gw.session.post(url, headers=headers) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
        async with gw.session.get(f"{gw.url}/v2/requests") as r:
            assert r.status == 401
        status, _ = await gw.cancel("abc")  # with the token
        assert status == 404


async def test_streaming_client_hangup_aborts_the_request(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as client:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "stream": True}
        resp = await client.post(
            f"{gateway.url}/v1/completions", json=body, headers={"X-Request-Id": "gone"}
        )
        await resp.content.readline()
        resp.close()  # the client hangs up mid-stream
    await wait_until(
        lambda: gateway.cancellations("client_disconnect", "decode") == 1, what="the abort"
    )
    assert await gateway.in_flight() == {}
    assert gateway.server.pool.workers[0].engine.load().running == 0


async def test_non_streaming_client_hangup_aborts_the_request(gateway: Gateway) -> None:
    async def client_that_gives_up() -> None:
        async with aiohttp.ClientSession() as client:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 4000}
            await client.post(
                f"{gateway.url}/v1/completions", json=body, headers={"X-Request-Id": "nb"}
            )

    task = asyncio.create_task(client_that_gives_up())
    await wait_until(lambda: _is(gateway.phase_of("nb"), "decode"), what="decode")
    task.cancel()  # closes the connection while the gateway has sent nothing yet
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(
        lambda: gateway.cancellations("client_disconnect", "decode") == 1, what="the abort"
    )
    assert await gateway.in_flight() == {}


async def test_list_in_flight(gateway: Gateway) -> None:
    resp = await start_stream(gateway, "listed")
    await resp.content.readline()
    entry = (await gateway.in_flight())["listed"]
    assert entry["model"] == MODEL and entry["phase"] == "decode" and entry["generated_tokens"] >= 1
    assert entry["age_s"] >= 0 and entry["protocol"] == "openai"
    await gateway.cancel("listed")
    await read_events(resp)


async def test_token_metrics_equal_what_was_streamed_however_a_stream_ends() -> None:
    """A stream adds its tokens to the shared series in batches (``token_books``); whether it
    completed, was cancelled by id or lost its client, every token is counted once it ended."""
    async with running_gateway(sim=SimConfig(step_base_s=0.002)) as gw:
        completed = await read_events(await start_stream(gw, "done", max_tokens=37))
        assert completed[-1] == "[DONE]" and len(completed) == 37 + 1
        cancelled = await start_stream(gw, "by-id")
        async with asyncio.timeout(10):
            for _ in range(21):  # one token per event
                await cancelled.content.readline()
                await cancelled.content.readline()
        assert (await gw.cancel("by-id"))[0] == 200
        streamed = 21 + sum(1 for e in await read_events(cancelled) if '"text"' in e)
        async with aiohttp.ClientSession() as client:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "stream": True}
            async with client.post(f"{gw.url}/v1/completions", json=body) as resp:
                await resp.content.readline()  # then the client hangs up
        await wait_until(lambda: gw.requests("cancelled") == 2, what="the hang-up's abort")
        wasted = gw.metric("hangup_gateway_wasted_tokens_total", model=MODEL)
        tokens = gw.metric("hangup_gateway_generated_tokens_total", model=MODEL)
        assert wasted > streamed and tokens == 37 + wasted
        gaps = gw.metric("hangup_gateway_inter_token_latency_seconds_count", model=MODEL)
        assert gaps == tokens - 3  # one per chunk but a stream's first, a token each
        assert gw.metric("hangup_gateway_time_to_first_token_seconds_count", model=MODEL) == 3
