"""The simulated engine's side of the P/D seam (``engine/handoff.py``), engine to engine without
the gateway: what an engine serving legs must do, whatever engine it is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.base import EngineRequest, FinishReason, SamplingParams
from gateway_server.engine.handoff import DisaggregatedEngine
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.engine.sim.kv import SimKvStore
from hangup_contract.cancel_labels import Phase

CONFIG = SimConfig(slots=2, step_base_s=0.002, prefill_chunk_tokens=4, transfer_per_block_s=0.02)
PROMPT = "word " * 64
"""64 tokens: 16 prefill steps, 4 blocks, 80 ms of transfer."""


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SimulatedEngine, SimulatedEngine]]:
    kv = SimKvStore()
    engines = (SimulatedEngine(CONFIG, kv), SimulatedEngine(CONFIG, kv))
    for engine in engines:
        await engine.start()
    yield engines
    for engine in engines:
        await engine.shutdown()


def request(rid: str, max_tokens: int = 6) -> EngineRequest:
    return EngineRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, seed=3))


def test_the_simulated_engine_serves_legs() -> None:
    assert isinstance(SimulatedEngine(CONFIG), DisaggregatedEngine)


async def test_decode_with_the_handoff_generates_what_one_engine_would(
    pair: tuple[SimulatedEngine, SimulatedEngine],
) -> None:
    prefill, decode = pair
    whole = "".join([c.text async for c in prefill.generate(request("whole"))])
    handoff = await prefill.prefill(request("p"), "key")
    assert handoff is not None
    assert (handoff.key, handoff.blocks, handoff.prompt_tokens) == ("key", 4, 64)
    assert prefill.handoff_blocks() == 4 and prefill.load().kv_cache_usage > 0
    chunks = [c async for c in decode.decode(request("d"), handoff)]
    assert "".join(c.text for c in chunks) == whole
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    assert prefill.handoff_blocks() == 0 and prefill.load().kv_cache_usage == 0  # pulled
    assert await prefill.release("key") == 0  # idempotent: nothing left


async def test_an_aborted_prefill_keeps_nothing(
    pair: tuple[SimulatedEngine, SimulatedEngine],
) -> None:
    prefill, _ = pair
    leg = asyncio.create_task(prefill.prefill(request("p"), "key"))
    await wait_until(lambda: prefill.phase("p") is Phase.PREFILL, what="prefill")
    await prefill.abort("p")
    assert await leg is None
    assert prefill.handoff_blocks() == 0 and prefill.load().kv_cache_usage == 0


async def test_an_abort_in_transfer_frees_the_decode_side_and_release_the_prefill_side(
    pair: tuple[SimulatedEngine, SimulatedEngine],
) -> None:
    prefill, decode = pair
    handoff = await prefill.prefill(request("p"), "key")
    assert handoff is not None
    stream = decode.decode(request("d", max_tokens=500), handoff)
    first = asyncio.ensure_future(anext(stream))
    await wait_until(lambda: decode.phase("d") is Phase.TRANSFER, what="transfer")
    assert decode.kv_blocks("d") == 4  # allocated while the KV is on its way
    await decode.abort("d")
    assert (await first).finish_reason is FinishReason.ABORT
    await stream.aclose()
    assert decode.load().kv_cache_usage == 0 and decode.kv_blocks("d") == 0
    assert await prefill.release("key") == 4
    assert prefill.load().kv_cache_usage == 0
