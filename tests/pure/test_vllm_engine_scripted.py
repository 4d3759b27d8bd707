"""``VllmEngine`` around a scripted stand-in for vLLM's ``AsyncLLM`` (no vLLM needed).

The stand-in (:class:`ScriptedAsyncLLM`) answers its utility call (``is_sleeping``) only when
the test says so, the way the real engine core answers only between model steps, and hands out
outputs only when the test puts them. That makes the ordering the gateway relies on exact:

- the token path waits for nothing but the engine's outputs: each output leaves as its own chunk
  while the utility call is unanswered (awaited first, it merged every token produced until the
  answer into one late chunk, and held whole streams back on the real engine);
- the phase stays ``queued`` until the core is known to hold the request, then follows the
  scheduler's statistics; the first token makes it ``decode``;
- an abort still returns only once the core has confirmed it.

What the real engine does is checked in ``tests/vllm/``; this file checks the wrapper.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bench.base.waiting import wait_until
from gateway_server.engine.base import (
    ChatOptions,
    EngineRequest,
    FinishReason,
    NoChatTemplate,
    SamplingParams,
    TokenChunk,
)
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.vllm import engine as vllm_engine
from gateway_server.engine.vllm.options import VllmOptions
from gateway_server.errors import InvalidRequest
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import CallRegistry
from gateway_server.service import GenerationService, ModelInfo
from hangup_contract.cancel_labels import Phase


class ScriptedCollector:
    """Per-request outputs, merged when the reader falls behind (as vLLM merges DELTA outputs)."""

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self._ready = asyncio.Event()
        self.closed = False

    def put(self, text: str, *, finished: bool = False) -> None:
        self._pending.append((text, finished))
        self._ready.set()

    def get_nowait(self) -> Any:
        if not self._pending:
            return None
        texts, finished = [t for t, _ in self._pending], self._pending[-1][1]
        self._pending.clear()
        self._ready.clear()
        completion = SimpleNamespace(
            text="".join(texts), token_ids=list(range(len(texts))),
            finish_reason="length" if finished else None, logprobs=None,
        )  # fmt: skip
        return SimpleNamespace(outputs=[completion], prompt_token_ids=[1, 2, 3], finished=finished,
                               prompt_logprobs=None)  # fmt: skip

    async def get(self) -> Any:
        while not self._pending:
            await self._ready.wait()
        return self.get_nowait()

    def close(self) -> None:
        self.closed = True


class ScriptedAsyncLLM:
    """A scripted stand-in for ``AsyncLLM``: the test releases utility answers and puts outputs."""

    errored = False

    def __init__(self) -> None:
        self.answer_utility = asyncio.Event()
        self.collectors: dict[str, ScriptedCollector] = {}
        self.aborted: list[str] = []
        self.utility_calls = 0

    async def add_request(self, request_id: str, prompt: str, params: Any) -> ScriptedCollector:
        collector = self.collectors[request_id] = ScriptedCollector()
        return collector

    async def is_sleeping(self) -> bool:
        self.utility_calls += 1
        await self.answer_utility.wait()
        return False

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM]:
    monkeypatch.setattr(vllm_engine, "sampling_params", lambda params: params)
    engine = vllm_engine.VllmEngine("scripted", VllmOptions())
    llm = ScriptedAsyncLLM()
    engine._llm = llm
    return engine, llm


def request(request_id: str = "r-1") -> EngineRequest:
    return EngineRequest(request_id, "Hello", SamplingParams(max_tokens=8))


async def next_chunk(stream: AsyncGenerator[TokenChunk, None]) -> TokenChunk:
    return await asyncio.wait_for(anext(stream), timeout=5)


async def test_tokens_leave_one_by_one_while_the_utility_call_is_unanswered(
    scripted: tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM],
) -> None:
    engine, llm = scripted
    stream = engine.generate(request())
    first = asyncio.ensure_future(anext(stream))
    await wait_until(lambda: "r-1" in llm.collectors)
    collector = llm.collectors["r-1"]

    collector.put("a")
    assert (await asyncio.wait_for(first, timeout=5)).text == "a"
    for text in ("b", "c"):
        collector.put(text)
        chunk = await next_chunk(stream)
        assert (chunk.text, chunk.new_tokens) == (text, 1)
    assert llm.utility_calls == 1 and not llm.answer_utility.is_set()

    collector.put("d", finished=True)
    last = await next_chunk(stream)
    assert last.finish_reason is FinishReason.LENGTH
    with pytest.raises(StopAsyncIteration):
        await next_chunk(stream)
    # The confirmation was stopped with the stream: nothing of this request is left running.
    assert collector.closed
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert engine.phase("r-1") is None


async def test_phase_is_queued_until_the_core_holds_the_request_then_follows_statistics(
    scripted: tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM],
) -> None:
    engine, llm = scripted
    stream = engine.generate(request())
    first = asyncio.ensure_future(anext(stream))
    await wait_until(lambda: llm.utility_calls == 1)
    stats = engine._stats
    stats.steps, stats.running, stats.waiting = 10, 1, 0
    assert engine.phase("r-1") is Phase.QUEUED, "no answer yet: no statistics are known to count it"

    llm.answer_utility.set()
    await wait_until(lambda: engine._live["r-1"].seen_after is not None)
    stats.steps += 1
    assert engine.phase("r-1") is Phase.QUEUED, "one step of margin after the answer"
    stats.steps += 1
    assert engine.phase("r-1") is Phase.PREFILL
    stats.waiting = 1
    assert engine.phase("r-1") is Phase.QUEUED, "the scheduler reports it waiting"

    llm.collectors["r-1"].put("a")
    await asyncio.wait_for(first, timeout=5)
    assert engine.phase("r-1") is Phase.DECODE
    await stream.aclose()
    await wait_until(lambda: engine.phase("r-1") is None)


async def _abort_after_first_token(
    engine: vllm_engine.VllmEngine, llm: ScriptedAsyncLLM
) -> tuple[AsyncGenerator[TokenChunk, None], asyncio.Future[None]]:
    """Request ``r-1`` streaming, its first token read, then its abort under way: vLLM told,
    the core asked to confirm (not answered yet). The stream and the abort."""
    stream = engine.generate(request())
    first = asyncio.ensure_future(anext(stream))
    await wait_until(lambda: "r-1" in llm.collectors)
    llm.collectors["r-1"].put("a")
    await asyncio.wait_for(first, timeout=5)
    calls = llm.utility_calls
    abort = asyncio.ensure_future(engine.abort("r-1"))
    await wait_until(lambda: llm.aborted == ["r-1"] and llm.utility_calls > calls)
    return stream, abort


async def test_an_abort_returns_once_the_core_confirmed_it(
    scripted: tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM],
) -> None:
    engine, llm = scripted
    stream, abort = await _abort_after_first_token(engine, llm)
    # The confirmation is asked and unanswered: the abort must still be waiting for it.
    assert not abort.done(), "the abort was sent but the core has not confirmed it"
    llm.answer_utility.set()
    await asyncio.wait_for(abort, timeout=5)
    assert engine.phase("r-1") is None
    await stream.aclose()
    assert llm.aborted == ["r-1"], "closing the stream after the abort does not abort again"


class _NoToolCalls:
    def plan(self, body: dict[str, Any]) -> None:
        return None


def test_a_model_without_a_chat_template_is_a_clear_client_error(
    scripted: tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM],
) -> None:
    """The engine says what it lacks (an engine error); the service turns it into the 400 a chat
    client gets, pointing at the completions API."""
    engine, _ = scripted
    engine._tokenizer_copy = SimpleNamespace(chat_template=None)
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(NoChatTemplate):
        engine.apply_chat_template(messages, ChatOptions())
    metrics = GatewayMetrics(CollectorRegistry(), ["scripted"])
    service = GenerationService(EnginePool([engine]), CallRegistry(metrics), metrics,
                                ModelInfo("scripted", 64), tools=_NoToolCalls())  # fmt: skip
    with pytest.raises(InvalidRequest, match="no chat template; use /v1/completions") as caught:
        service.chat_prompt(messages)
    assert caught.value.status == 400


async def test_an_abort_under_way_when_the_core_dies_returns_at_once(
    scripted: tuple[vllm_engine.VllmEngine, ScriptedAsyncLLM],
) -> None:
    # vLLM leaves the utility calls a core was killed under unanswered; seen in the chaos soak
    # with the real engine: a cancel just before vLLM noticed the SIGKILL waited 30 s.
    engine, llm = scripted
    stream, abort = await _abort_after_first_token(engine, llm)
    assert not abort.done()
    llm.errored = True  # the core died; its answer never comes
    await asyncio.wait_for(abort, timeout=5)
    assert engine.phase("r-1") is None
    await stream.aclose()
