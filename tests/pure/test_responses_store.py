"""The Responses API's store: held while running, kept by count and age when stored, forgotten
otherwise; background responses in flight bounded; a resumed stream's replay and follow."""

from __future__ import annotations

import asyncio

import pytest

from gateway_server.errors import TooManyRequests
from gateway_server.responses.objects import Answer, Status
from gateway_server.responses.store import ResponseRecord, ResponseStore


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(n: int, *, store: bool = True, background: bool = False) -> ResponseRecord:
    answer = Answer(f"resp_{n}", "m", {}, status=Status.IN_PROGRESS)
    return ResponseRecord(answer, str(n), store, background, [])


async def test_stored_responses_are_kept_by_count_then_age() -> None:
    clock = ManualClock()
    store = ResponseStore(2, 60.0, clock)
    kept = [record(i) for i in range(3)]
    for r in kept:
        store.start(r)
        assert store.get(r.id) is r  # held while it runs
        store.finish(r)
    assert store.get("resp_0") is None  # the oldest went
    assert store.get("resp_1") is kept[1] and len(store) == 2
    clock.now += 60.0
    assert store.get("resp_2") is None and len(store) == 0


async def test_store_false_is_held_only_while_running() -> None:
    store = ResponseStore(10, 60.0, ManualClock())
    r = record(1, store=False)
    store.start(r)
    assert store.get(r.id) is r
    store.finish(r)
    assert store.get(r.id) is None and r.ended


async def test_background_responses_in_flight_are_bounded() -> None:
    store = ResponseStore(1, 60.0, ManualClock())
    first = record(1, background=True)
    store.start(first)
    store.start(record(2))  # a synchronous one is bounded by the registry, not here
    with pytest.raises(TooManyRequests, match="1 background responses are in flight"):
        store.start(record(3, background=True))
    store.finish(first)
    store.start(record(4, background=True))


async def test_follow_replays_after_a_sequence_number_then_waits_for_new_events() -> None:
    r = record(1, background=True)
    r.emit([r.events.created(), r.events.in_progress()])
    seen: list[bytes] = []

    async def read() -> None:
        async for chunk in r.follow(0):
            seen.append(chunk)

    reader = asyncio.create_task(read())
    r.emit([r.events.delta("a")])
    r.answer.status = Status.CANCELLED
    r.emit(r.events.ended())
    r.end()
    await reader
    assert [b"response.in_progress" in seen[0], b'"delta": "a"' in seen[1]] == [True, True]
    assert b'"status": "cancelled"' in seen[-1] and len(seen) == 3
