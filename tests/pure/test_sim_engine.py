"""The simulated engine: slots, FIFO queue, phases, aborts at step boundaries, determinism."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.base import EngineRequest, FinishReason, SamplingParams, TokenChunk
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from hangup_contract.cancel_labels import Phase

FAST = SimConfig(slots=2, step_base_s=0.002, step_per_seq_s=0.0, prefill_per_token_s=0.0)


@pytest.fixture
async def engine() -> AsyncIterator[SimulatedEngine]:
    eng = SimulatedEngine(FAST)
    await eng.start()
    yield eng
    await eng.shutdown()


def req(rid: str, prompt: str = "hello there", max_tokens: int = 5, **kw: object) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw))  # type: ignore[arg-type]


async def collect(engine: SimulatedEngine, request: EngineRequest) -> list[TokenChunk]:
    return [chunk async for chunk in engine.generate(request)]


async def test_generates_max_tokens_then_length(engine: SimulatedEngine) -> None:
    chunks = await collect(engine, req("a", max_tokens=4))
    assert [c.new_tokens for c in chunks] == [1, 1, 1, 1]
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    assert all(c.prompt_tokens == 2 for c in chunks)


async def test_same_request_same_text_and_seed_changes_it(engine: SimulatedEngine) -> None:
    first = "".join(c.text for c in await collect(engine, req("a", max_tokens=8)))
    again = "".join(c.text for c in await collect(engine, req("b", max_tokens=8)))
    other = "".join(c.text for c in await collect(engine, req("c", max_tokens=8, seed=42)))
    assert first == again
    assert first != other


async def test_stop_string_ends_with_stop(engine: SimulatedEngine) -> None:
    text = "".join(c.text for c in await collect(engine, req("a", max_tokens=12)))
    word = text.split()[3]
    chunks = await collect(engine, req("b", max_tokens=12, stop=(word,)))
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert "".join(c.text for c in chunks) == text[: text.index(word)]


async def test_requests_beyond_slots_wait_fifo_in_queued_phase(engine: SimulatedEngine) -> None:
    long = [asyncio.create_task(collect(engine, req(f"r{i}", max_tokens=1000))) for i in range(2)]
    await wait_until(
        lambda: engine.phase("r0") is Phase.DECODE and engine.phase("r1") is Phase.DECODE
    )
    waiting = asyncio.create_task(collect(engine, req("w", max_tokens=2)))
    await wait_until(lambda: engine.phase("w") is Phase.QUEUED)
    assert engine.load().running == 2 and engine.load().waiting == 1
    steps_before = engine.steps
    await engine.abort("r0")  # frees a slot at the step boundary: "w" is admitted next
    assert engine.steps - steps_before <= 1
    assert (await waiting)[-1].finish_reason is FinishReason.LENGTH
    await engine.abort("r1")
    ends = [(await t)[-1].finish_reason for t in long]
    assert ends == [FinishReason.ABORT, FinishReason.ABORT]


async def test_long_prompt_is_in_prefill_until_first_token() -> None:
    eng = SimulatedEngine(SimConfig(step_base_s=0.002, prefill_chunk_tokens=10))
    await eng.start()
    try:
        task = asyncio.create_task(collect(eng, req("p", prompt="w " * 200, max_tokens=2)))
        await wait_until(lambda: eng.phase("p") is Phase.PREFILL)
        await eng.abort("p")
        assert eng.phase("p") is None
        chunks = await task
        assert chunks == [TokenChunk("", 0, 200, FinishReason.ABORT)]
    finally:
        await eng.shutdown()


async def test_abort_is_idempotent_and_unknown_ids_are_ignored(engine: SimulatedEngine) -> None:
    await engine.abort("never-seen")
    task = asyncio.create_task(collect(engine, req("a", max_tokens=1000)))
    await wait_until(lambda: engine.phase("a") is Phase.DECODE)
    await asyncio.gather(engine.abort("a"), engine.abort("a"))
    await engine.abort("a")
    assert (await task)[-1].finish_reason is FinishReason.ABORT
    assert engine.load().running == 0


async def test_consumer_leaving_frees_the_slot(engine: SimulatedEngine) -> None:
    stream = engine.generate(req("a", max_tokens=1000))
    await anext(stream)
    await stream.aclose()
    await wait_until(lambda: engine.phase("a") is None and engine.load().running == 0)


async def test_kv_cache_usage_returns_to_zero_after_abort(engine: SimulatedEngine) -> None:
    task = asyncio.create_task(collect(engine, req("a", prompt="w " * 50, max_tokens=1000)))
    await wait_until(lambda: engine.load().kv_cache_usage > 0)
    await engine.abort("a")
    await task
    assert engine.load().kv_cache_usage == 0.0
