"""The call registry: duplicate ids, tombstones, finished calls, bounded memory."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from bench.base.waiting import wait_until
from gateway_server.errors import (
    CancelledBeforeArrival,
    DuplicateRequestId,
    InvalidRequest,
    RequestNotFound,
)
from gateway_server.labels import Protocol
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import (
    ENTRY_BYTES,
    SWEEP_GRANULE,
    CallRegistry,
    EngineCall,
    IdBounds,
)
from hangup_contract.cancel_labels import Reason


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: ManualClock, **kw: object) -> CallRegistry:
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
    reg = make(ManualClock(), ended=IdBounds(count=3))
    for i in range(10):
        reg.close(reg.open(f"c{i}", "m", Protocol.OPENAI))
    assert (await reg.cancel("c9", Reason.EXPLICIT)).state == "finished"
    with pytest.raises(RequestNotFound):
        await reg.cancel("c0", Reason.EXPLICIT)


async def test_memory_is_bounded_in_bytes_as_well_as_ids() -> None:
    """Cancels of long ids that were never seen (each leaves a tombstone) fill no more than the
    byte bound, whatever their count; the newest is kept, the oldest dropped."""
    reg = make(ManualClock(), tombstones=IdBounds(size=64 * 1024))
    ids = [f"{i:06d}:" + "x" * 250 for i in range(2000)]  # alias-sized: 257 characters
    for rid in ids:
        with pytest.raises(RequestNotFound):
            await reg.cancel(rid, Reason.EXPLICIT)
    assert 60 * 1024 < reg.remembered_bytes <= 64 * 1024
    assert reg.remembered_bytes // (len(ids[0]) + ENTRY_BYTES) < 2000 / 10
    with pytest.raises(CancelledBeforeArrival):
        reg.open(ids[-1], "m", Protocol.OPENAI)
    reg.close(reg.open(ids[0], "m", Protocol.OPENAI))  # its tombstone went first


async def test_tombstones_and_ended_ids_expire_by_themselves() -> None:
    """No call arrives, nothing is looked up: the ids' memory is given back at the TTL anyway."""
    reg = CallRegistry(
        GatewayMetrics(CollectorRegistry(), ["m"]), tombstone_ttl=0.05, finished_ttl=0.05
    )
    for i in range(100):
        with pytest.raises(RequestNotFound):
            await reg.cancel(f"unknown-{i}", Reason.EXPLICIT)
        reg.close(reg.open(f"ended-{i}", "m", Protocol.OPENAI))
    assert reg.remembered_bytes > 0
    await wait_until(
        lambda: reg.remembered_bytes == 0, SWEEP_GRANULE + 5.0, what="the ids' memory given back"
    )


async def test_an_alias_no_cancel_can_name_is_refused() -> None:
    """A stream request whose own id makes an alias past the cancel rule is refused: no id
    longer than a cancel may name is held."""
    reg = make(ManualClock())
    call = reg.open("stream-1", "m", Protocol.KSERVE_GRPC)
    too_long = EngineCall("stream-1-1", placement=None, alias="stream-1:" + "r" * 300)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="at most 257 characters"):
        reg.attach(call, too_long)
    fits = EngineCall("stream-1-2", placement=None, alias="stream-1:" + "r" * 248)  # type: ignore[arg-type]
    reg.attach(call, fits)
    assert reg.holds("stream-1:" + "r" * 248)
