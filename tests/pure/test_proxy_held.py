"""The calls the proxy holds by id (``proxy/calls/held.py``, issue 59), on a clock the test
moves: a trusted id is one call's only; a client id that breaks the rule is never kept; the
memories of ended ids and tombstones are bounded in count and in bytes and expire by themselves;
what they count as bytes is what they take."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass

import pytest

from hangup_contract.cancel_labels import Reason
from hangup_contract.request_id import new_request_id
from proxy.calls.held import ID_COST, Bounds, HeldCalls
from proxy.errors import CancelledById, DuplicateRequestId


@dataclass(eq=False)
class FakeCall:
    request_id: str | None
    client_request_id: str | None = None
    group: str | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def never(reason: Reason) -> None:
    return None


def held_calls(clock: Clock, *, trust: bool = False, **bounds: int | float) -> HeldCalls:
    return HeldCalls(Bounds(**bounds), trust_client=trust, clock=clock)  # type: ignore[arg-type]


async def test_a_held_call_is_found_by_both_ids_then_answered_finished_until_the_ttl() -> None:
    clock = Clock()
    held = held_calls(clock, ttl=60)
    call = FakeCall("up-1", "job-1")
    holding = held.hold(call, never)
    assert [c for c, _ in held.find("up-1")] == [call] == [c for c, _ in held.find("job-1")]
    held.release(holding)
    assert held.find("job-1") == []
    assert await held.cancel("job-1") == "finished" == await held.cancel("up-1")
    clock.now += 61
    assert await held.cancel("job-1") is None  # past the ttl, even before the timer ran
    held.expire()
    assert held.sizes() == {
        "live": (0, 0), "ended": (0, 0), "tombstone": (0, 0), "group_tombstone": (0, 0)
    }  # fmt: skip


def test_a_trusted_id_already_held_is_refused_and_holds_nothing() -> None:
    held = held_calls(Clock(), trust=True)
    owner = held.hold(FakeCall("victim-1", "victim-1"), never)
    assert owner.trusted and owner.key == "victim-1"
    with pytest.raises(DuplicateRequestId, match="victim-1"):
        held.hold(FakeCall("victim-1", "victim-1"), never)
    assert len(held.find("victim-1")) == 1
    assert held.sizes()["live"][0] == 1
    held.release(owner)
    held.hold(FakeCall("victim-1", "victim-1"), never)  # free again once its call ended


@pytest.mark.parametrize("alias", ["victim-1:0", "victim-1:a:b", "victim-1:"])
def test_a_trusted_id_that_extends_a_held_one_with_a_colon_is_refused(alias: str) -> None:
    """``<call id>:<request id>`` names one request of a held gRPC stream on the gateway."""
    held = held_calls(Clock(), trust=True)
    held.hold(FakeCall("victim-1", "victim-1"), never)
    with pytest.raises(DuplicateRequestId, match="already in flight"):
        held.hold(FakeCall(alias, alias), never)
    assert held.holds(alias) and held.holds("victim-1") and not held.holds("victim-2:0")
    held.hold(FakeCall("victim-10:0", "victim-10:0"), never)  # another id, not an extension


def test_without_trust_calls_share_a_client_id_and_each_leaves_it_in_turn() -> None:
    clock = Clock()
    held = held_calls(clock)
    first = held.hold(FakeCall(new_request_id(), "edge-7"), never)
    second = held.hold(FakeCall(new_request_id(), "edge-7"), never)
    assert len(held.find("edge-7")) == 2
    held.release(first)
    assert len(held.find("edge-7")) == 1
    held.release(second)
    assert held.find("edge-7") == [] and held.sizes()["ended"][0] == 3  # two fresh ids, one alias


@pytest.mark.parametrize("client", ["x" * 8192, "has space", "", "é", "a" * 129])
def test_a_client_id_that_breaks_the_rule_is_never_kept(client: str) -> None:
    clock = Clock()
    held = held_calls(clock)
    call = FakeCall(new_request_id(), client)
    holding = held.hold(call, never)
    assert held.find(client) == []
    assert held.sizes()["live"] == (1, 32 + ID_COST)
    held.release(holding)
    held.bury(client)
    assert not held.buried(client)
    assert held.sizes()["ended"] == (1, 32 + ID_COST)


def test_a_tombstone_refuses_one_call_under_its_id_then_is_spent() -> None:
    held = held_calls(Clock(), trust=True)
    spent: list[str] = []
    held.on_spent = spent.append
    held.bury("early-1")
    with pytest.raises(CancelledById):
        held.hold(FakeCall("early-1", "early-1"), never)
    assert spent == ["early-1"] and not held.buried("early-1")
    held.hold(FakeCall("early-1", "early-1"), never)


def test_a_tombstone_for_a_client_alias_refuses_the_call_and_holds_nothing() -> None:
    held = held_calls(Clock())
    held.bury("edge-8")
    upstream = new_request_id()
    with pytest.raises(CancelledById):
        held.hold(FakeCall(upstream, "edge-8"), never)
    assert held.find(upstream) == [] and held.sizes()["live"] == (0, 0)


def test_ended_ids_are_bounded_in_count_the_oldest_forgotten_first() -> None:
    clock = Clock()
    held = held_calls(clock, ended=100)
    ids = [new_request_id() for _ in range(250)]
    for request_id in ids:
        held.release(held.hold(FakeCall(request_id), never))
    assert held.sizes()["ended"] == (100, 100 * (32 + ID_COST))
    assert not held.find(ids[0]) and held.sizes()["live"] == (0, 0)


async def test_ended_ids_are_bounded_in_bytes() -> None:
    clock = Clock()
    most = 50 * (128 + ID_COST)
    held = held_calls(clock, trust=True, ended_bytes=most)
    for n in range(200):
        request_id = f"{n:04d}" + "x" * 124  # 128 characters, the rule's longest
        held.release(held.hold(FakeCall(request_id, request_id), never))
    count, size = held.sizes()["ended"]
    assert (count, size) == (50, most)
    assert await held.cancel("0199" + "x" * 124) == "finished"
    assert await held.cancel("0000" + "x" * 124) is None


def test_tombstones_are_bounded_in_count_and_bytes_and_expire_by_themselves() -> None:
    clock = Clock()
    held = held_calls(clock, ttl=5, tombstones=10, tombstone_bytes=10**9)
    for n in range(30):
        held.bury(f"gone-{n}")
    assert held.sizes()["tombstone"][0] == 10
    assert not held.buried("gone-0") and held.buried("gone-29")
    clock.now += 5
    held.expire()
    assert held.sizes()["tombstone"] == (0, 0) and not held.buried("gone-29")
    small = held_calls(clock, tombstone_bytes=3 * (6 + ID_COST) + 5)
    for n in range(10):
        small.bury(f"gone-{n}")  # 6 characters each
    assert small.sizes()["tombstone"] == (3, 3 * (6 + ID_COST))


def test_an_id_refused_elsewhere_is_dropped_without_a_memory() -> None:
    """With ``--workers``, a trusted id another worker holds: the call never ran, so a cancel
    here must not answer ``finished`` for the other worker's call."""
    held = held_calls(Clock(), trust=True)
    holding = held.hold(FakeCall("dup-1", "dup-1"), never)
    held.drop(holding)
    assert not held.holds("dup-1") and held.sizes() == {
        "live": (0, 0), "ended": (0, 0), "tombstone": (0, 0), "group_tombstone": (0, 0)
    }  # fmt: skip


def test_what_an_id_is_counted_as_is_what_it_takes() -> None:
    """``ID_COST`` and the characters, against what Python allocates for 20,000 ended ids of
    each length (the table, the slots, the strings, the queue): within a factor of 1.25."""
    for length in (32, 128):
        clock = Clock()
        held = held_calls(clock, trust=True, ended=10**6, ended_bytes=10**9)
        ids = [f"{n:08d}".ljust(length, "x") for n in range(20_000)]
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for request_id in ids:
            held.release(held.hold(FakeCall(request_id, request_id), never))
        taken = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        counted = held.sizes()["ended"][1]
        # The strings themselves were made before: what they take is added as Python sizes them.
        taken += sum(request_id.__sizeof__() for request_id in ids)
        assert counted / 1.25 <= taken <= counted * 1.25, (length, taken, counted)
