"""The simulated engine under hostile requests: what a request's fields may cost it (CPU of the
engine's thread against ``bench.harness.hostile.Budget`` for the field's bytes as a client sent
them, memory kept after the request ended), what its tokenizer makes of a long word, and whose
request it admits next when one call floods its queue.

The fields are built as the gateway's parser builds them (``gateway_server.requests``), without
going through it: the engine is held to its own share of the work whatever the parser accepts.
"""

from __future__ import annotations

import asyncio
import gc
import io
import itertools
import json
import sys
import time
import tracemalloc
import unicodedata
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from bench.base.waiting import wait_until
from bench.harness.hostile import MIB, Budget
from gateway_server.engine.base import EngineRequest, SamplingParams, Share, TokenChunk
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.engine.sim.sampling import VOCAB
from tests.support.gateway import MODEL, running_gateway

FAST = SimConfig(slots=16, step_base_s=0.0005, step_per_seq_s=0.0, prefill_per_token_s=0.0)


@pytest.fixture
async def engine() -> AsyncIterator[SimulatedEngine]:
    eng = SimulatedEngine(FAST)
    await eng.start()
    yield eng
    await eng.shutdown()


async def run_choices(
    engine: SimulatedEngine, name: str, params: SamplingParams, n: int
) -> tuple[list[str], float]:
    """``n`` choices of one call, as the OpenAI layer runs them (one params object); their texts
    and the engine thread's CPU seconds until the last ended."""

    async def one(i: int) -> str:
        request = EngineRequest(f"{name}-{i}", "hello there", params, Share("", name))
        return "".join([chunk.text async for chunk in engine.generate(request)])

    start = time.thread_time()
    texts = await asyncio.gather(*(one(i) for i in range(n)))
    return list(texts), time.thread_time() - start


def zero_spellings(count: int) -> list[str]:
    """``count`` different JSON keys that ``int()`` reads as 0 (every Unicode digit zero)."""
    zeros = [
        chr(c)
        for c in range(sys.maxunicode)
        if unicodedata.category(chr(c)) == "Nd" and unicodedata.digit(chr(c)) == 0
    ]
    runs = (itertools.product(zeros, repeat=k) for k in itertools.count(1))
    return ["".join(t) for t in itertools.islice(itertools.chain.from_iterable(runs), count)]


async def test_a_logit_bias_of_350k_spellings_of_one_token_costs_one_read(
    engine: SimulatedEngine,
) -> None:
    """Was: 350 k spellings of token 0 kept ~30 MB a request in the sampler's cache (256 entries:
    gigabytes) and cost the engine about a second of CPU, the loop held meanwhile."""
    spellings = zero_spellings(350_000)
    sent = len(json.dumps(dict.fromkeys(spellings, 1), ensure_ascii=False).encode())

    def params(value: float) -> SamplingParams:  # as gateway_server.requests reads the field
        bias = tuple((int(key), float(value)) for key in spellings)
        return SamplingParams(max_tokens=8, temperature=0.7, seed=1, logit_bias=bias)

    plain, _ = await run_choices(engine, "warm", SamplingParams(max_tokens=8, seed=1), 16)
    _, baseline = await run_choices(engine, "plain", SamplingParams(max_tokens=8, seed=1), 16)
    texts, spent = await run_choices(engine, "biased", params(5.0), 16)
    assert {text.split()[0] for text in texts} == {VOCAB[0]} != {plain[0].split()[0]}
    Budget().check("16 choices with a 350k-key logit_bias", sent, spent - baseline)

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(3):  # three clients' biases: three cache entries
            await run_choices(engine, f"kept-{k}", params(1.0 + k), 2)
        await asyncio.sleep(0.01)  # a step: the engine forgets the last request's fields
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < MIB, f"{kept / MIB:.1f} MiB kept after three requests ended"


async def test_a_million_stop_token_ids_cost_nothing_per_token(engine: SimulatedEngine) -> None:
    """Was: the ids were scanned as a tuple at every token: a 3.8 MB request with n=16 cost
    the engine 54 s of CPU."""
    never = VOCAB.index("fox")
    keep_out = ((never, -100.0),)  # the stop token is never drawn: every choice runs to the end
    ids = (never,) * 1_900_000
    sent = len(json.dumps(list(ids)).encode())
    assert sent > 3.6 * MIB
    plain = SamplingParams(max_tokens=64, seed=2, logit_bias=keep_out)
    await run_choices(engine, "warm", plain, 16)
    _, baseline = await run_choices(engine, "plain", plain, 16)
    texts, spent = await run_choices(
        engine, "stops", SamplingParams(max_tokens=64, seed=2, logit_bias=keep_out,
                                        stop_token_ids=ids), 16)  # fmt: skip
    assert all(len(text.split()) == 64 for text in texts)
    Budget().check("16 choices of 64 tokens with 1.9 M stop_token_ids", sent, spent - baseline)


async def test_stop_strings_cost_a_token_its_own_text_not_the_answers(
    engine: SimulatedEngine,
) -> None:
    """Was: every token searched the whole answer so far for each stop string: 16 choices of
    4,000 tokens with four 2-character stop strings cost 2.4 s of CPU more than without them
    (five times the rest of their work; 2,000 tokens: about twice).
    A token searches only the text it can complete a stop string in (as vLLM's checker)."""
    plain = SamplingParams(max_tokens=2000, seed=3)
    _, baseline = await run_choices(engine, "plain", plain, 16)
    texts, spent = await run_choices(engine, "stops", replace(plain, stop=("zz",) * 4), 16)
    assert all(len(text.split()) == 2000 for text in texts)
    assert spent - baseline < baseline, f"{spent - baseline:.2f} s for the stop strings"


def test_a_long_word_is_many_tokens_so_the_context_bounds_bytes() -> None:
    """Was: a 7 MB word without a space counted as one token and fitted any context."""
    engine = SimulatedEngine(FAST)
    assert engine.count_prompt_tokens("x" * 7_000_000) == 437_500
    assert engine.count_prompt_tokens(" " * 100) == 7  # whitespace is text too
    assert engine.count_prompt_tokens("the quick brown fox") == 4  # words as before
    assert engine.count_prompt_tokens("a " * 4096) * 16 >= len("a " * 4096)
    start = time.thread_time()
    engine.count_prompt_tokens("x" * 8 * MIB)
    Budget().check("counting an 8 MiB word", 8 * MIB, time.thread_time() - start)


async def test_stored_responses_hold_a_context_of_text_not_a_body() -> None:
    """Was: 12 stored responses of a 7 MB word each held +107 MB."""
    async with running_gateway() as gw:
        body = json.dumps({"model": MODEL, "input": "x" * 7_000_000, "max_output_tokens": 1})
        headers = {"Content-Type": "application/json"}
        for _ in range(3):
            async with gw.session.post(
                f"{gw.url}/v1/responses", data=io.BytesIO(body.encode()), headers=headers
            ) as resp:
                answer = await resp.json()
                assert resp.status == 400, answer
                assert "context length" in answer["error"]["message"]
        assert len(gw.server.responses.store) == 0


async def test_one_calls_twenty_thousand_requests_wait_behind_another_calls_first(
    engine: SimulatedEngine,
) -> None:
    """Was: the queue was FIFO: a call (a gRPC stream) that queued 20,000 requests first
    delayed every other call until all of them were admitted."""
    flooding = SamplingParams(max_tokens=50)
    flood = [
        asyncio.create_task(drain(engine, EngineRequest(f"f{i}", "x", flooding, Share("", "f"))))
        for i in range(20_000)
    ]
    await wait_until(lambda: engine.load().waiting >= 19_000, what="the flood queued")
    victim = EngineRequest("v", "hello", SamplingParams(max_tokens=5), Share("", "victim"))
    async with asyncio.timeout(30):
        chunks = await drain(engine, victim)
    assert chunks[-1].finish_reason is not None and sum(c.new_tokens for c in chunks) == 5
    assert engine.load().waiting >= 19_000 - 2 * FAST.slots
    start = time.thread_time()
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    await wait_until(lambda: engine.load().waiting == 0, what="the flood's aborts applied")
    assert time.thread_time() - start < 5.0


async def drain(engine: SimulatedEngine, request: EngineRequest) -> list[TokenChunk]:
    return [chunk async for chunk in engine.generate(request)]
