"""A call, or one request of a gRPC stream under an id of its own (an alias), whose client goes
away while the id's home process has not answered the claim yet: nothing stays in flight, the
engine worker it was placed on is free again, the home is told the id ended (so the id is not
refused later as in flight), and the hang-up is counted as a cancellation in the queued phase.

The home here is scripted (:class:`_UnansweringHome`, a call directory whose claims of some ids
never answer, as a stalled sibling's); ``tests/multi_process/test_gateway_api_processes.py``
checks the call's case against a real stalled API process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway_server.engine.base import SamplingParams
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.labels import Protocol
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import CallRegistry
from gateway_server.service import GenerationService, ModelInfo
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import Reason

MODEL = "sim"


class _UnansweringHome:
    """The gateway-wide directory, scripted: a claim of an id in ``silent`` never gets an answer
    (``asked`` is set once one waits); every other claim is granted. Releases are recorded."""

    def __init__(self, silent: set[str]) -> None:
        self.silent = silent
        self.asked = asyncio.Event()
        self.released: list[tuple[str, int]] = []

    def fresh_id(self) -> str:
        raise AssertionError("every call in these tests has its id")

    async def claim(self, request_id: str) -> None:
        if request_id in self.silent:
            self.asked.set()
            await asyncio.Event().wait()

    def release(self, request_id: str, tokens: int) -> None:
        self.released.append((request_id, tokens))

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        raise AssertionError("no cancel is sent in these tests")

    async def all_calls(self) -> list[dict[str, object]]:
        return []


class _NoToolCalls:
    def plan(self, body: dict[str, Any]) -> None:
        return None


class _Gateway:
    def __init__(self, home: _UnansweringHome) -> None:
        self.samples = CollectorRegistry()
        metrics = GatewayMetrics(self.samples, [MODEL])
        self.pool = EnginePool([SimulatedEngine(SimConfig(step_base_s=0.002))])
        self.registry = CallRegistry(metrics)
        self.service = GenerationService(
            self.pool, self.registry, metrics, ModelInfo(MODEL, 4096), home, tools=_NoToolCalls()
        )

    def cancelled_before_running(self) -> float | None:
        labels = {"model": MODEL, "reason": "client_disconnect", "phase": "queued"}
        return self.samples.get_sample_value("hangup_gateway_cancellations_total", labels)


@pytest.fixture
async def home() -> _UnansweringHome:
    return _UnansweringHome({"call-1", "stream-1:request-1"})


@pytest.fixture
async def gateway(home: _UnansweringHome) -> AsyncIterator[_Gateway]:
    gateway = _Gateway(home)
    await gateway.pool.start()
    try:
        yield gateway
    finally:
        await gateway.pool.shutdown()


async def test_a_call_cancelled_while_its_home_answers_is_held_nowhere_and_counted(
    home: _UnansweringHome, gateway: _Gateway
) -> None:
    async def call() -> None:
        async with gateway.service.call("call-1", MODEL, Protocol.OPENAI):
            raise AssertionError("the call ran before its home answered")

    task = asyncio.create_task(call())
    await asyncio.wait_for(home.asked.wait(), 5)
    task.cancel()  # as aiohttp does when the client's connection closes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gateway.registry.describe() == []
    assert home.released == [("call-1", 0)]
    assert gateway.cancelled_before_running() == 1
    home.silent.clear()  # the home answers now
    async with gateway.service.call("call-1", MODEL, Protocol.OPENAI):  # not held: taken again
        pass


async def test_a_stream_request_cancelled_while_its_alias_home_answers_frees_its_worker(
    home: _UnansweringHome, gateway: _Gateway
) -> None:
    worker = gateway.pool.workers[0]
    async with gateway.service.call("stream-1", MODEL, Protocol.KSERVE_GRPC) as call:
        params = SamplingParams(max_tokens=4)
        chunks = gateway.service.generate(call, "hi", params, alias="stream-1:request-1")
        first = asyncio.ensure_future(anext(chunks))
        await asyncio.wait_for(home.asked.wait(), 5)
        assert worker.in_flight == 1  # placed before the claim
        first.cancel()  # the gRPC stream was cancelled
        with pytest.raises(asyncio.CancelledError):
            await first
        assert worker.in_flight == 0
        assert call.requests == {}
    assert home.released == [("stream-1:request-1", 0), ("stream-1", 0)]
    assert gateway.cancelled_before_running() == 1
    home.silent.clear()
    async with gateway.service.call("stream-1:request-1", MODEL, Protocol.OPENAI):
        pass  # the alias is not held in flight either
