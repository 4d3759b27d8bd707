"""The call registry: duplicate ids, tombstones, finished calls, bounded memory."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway_server.errors import CancelledBeforeArrival, DuplicateRequestId, RequestNotFound
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import CallRegistry
from gateway_server.vocabulary import Protocol
from hangup_contract.vocabulary import Reason


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: ManualClock, **kw: float) -> CallRegistry:
    return CallRegistry(GatewayMetrics(CollectorRegistry(), ["m"]), clock=clock, **kw)  # type: ignore[arg-type]


async def test_duplicate_in_flight_id_is_refused_until_closed() -> None:
    reg = make(ManualClock())
    call = reg.open("a", "m", Protocol.OPENAI)
    with pytest.raises(DuplicateRequestId):
        reg.open("a", "m", Protocol.OPENAI)
    reg.close(call)
    reg.close(reg.open("a", "m", Protocol.OPENAI))


async def test_cancel_before_arrival_leaves_a_tombstone_that_rejects_the_request() -> None:
    clock = ManualClock()
    reg = make(clock, tombstone_ttl=5.0)
    with pytest.raises(RequestNotFound):
        await reg.cancel("early", Reason.CLIENT_DISCONNECT)
    with pytest.raises(CancelledBeforeArrival) as info:
        reg.open("early", "m", Protocol.OPENAI)
    assert info.value.reason is Reason.CLIENT_DISCONNECT
    reg.close(reg.open("early", "m", Protocol.OPENAI))  # the tombstone is spent


async def test_tombstones_expire() -> None:
    clock = ManualClock()
    reg = make(clock, tombstone_ttl=5.0)
    with pytest.raises(RequestNotFound):
        await reg.cancel("late", Reason.EXPLICIT)
    clock.now += 6
    reg.close(reg.open("late", "m", Protocol.OPENAI))


async def test_cancel_after_the_end_answers_finished_until_forgotten() -> None:
    clock = ManualClock()
    reg = make(clock, finished_ttl=10.0)
    call = reg.open("done", "m", Protocol.OPENAI)
    call.generated_tokens = 7
    reg.close(call)
    result = await reg.cancel("done", Reason.EXPLICIT)
    assert (result.state, result.generated_tokens) == ("finished", 7)
    clock.now += 11
    with pytest.raises(RequestNotFound):
        await reg.cancel("done", Reason.EXPLICIT)


async def test_memory_is_bounded() -> None:
    reg = make(ManualClock(), max_remembered=3)
    for i in range(10):
        reg.close(reg.open(f"c{i}", "m", Protocol.OPENAI))
    assert (await reg.cancel("c9", Reason.EXPLICIT)).state == "finished"
    with pytest.raises(RequestNotFound):
        await reg.cancel("c0", Reason.EXPLICIT)
