"""The Responses API's store: held while running, kept by count and age when stored, forgotten
otherwise; background responses in flight bounded, and per client; a resumed stream's replay and
follow."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.base.waiting import wait_until
from gateway_server.errors import DuplicateRequestId, TooManyRequests
from gateway_server.openai.responses.objects import Answer, Status, encode
from gateway_server.openai.responses.store import ResponseRecord, ResponseStore


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(
    n: int, *, store: bool = True, background: bool = False, client: str = ""
) -> ResponseRecord:
    answer = Answer(f"resp_{n}", "m", {}, status=Status.IN_PROGRESS)
    return ResponseRecord(answer, str(n), store, background, [], client)


def stored(store: ResponseStore, r: ResponseRecord) -> ResponseRecord:
    store.start(r)
    store.finish(r)
    return r


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


async def test_a_record_is_never_replaced_by_another_under_its_id() -> None:
    """An id held (running or stored) takes no other record, and a record the store did not
    take for the id never lands on the stored one when its response ends."""
    store = ResponseStore(10, 60.0, ManualClock())
    victim = record(1)
    store.start(victim)
    store.finish(victim)
    intruder = record(1)
    intruder.turns.append({"role": "user", "content": "the attacker's turn"})
    with pytest.raises(DuplicateRequestId):
        store.start(intruder)
    store.finish(intruder)
    assert store.get("resp_1") is victim and victim.turns == []


async def test_a_client_storing_past_its_share_drops_its_own_oldest_never_anothers() -> None:
    """Was: one count for every client, the oldest dropped first, so a client storing as many
    responses as the store holds pushed every other client's out."""
    store = ResponseStore(10, 60.0, ManualClock(), stored_per_client=3)
    victim = stored(store, record(0, client="victim"))
    flood = [stored(store, record(n, client="attacker")) for n in range(1, 101)]
    assert store.get(victim.id) is victim
    assert [r for r in flood if store.get(r.id) is not None] == flood[-3:]
    assert len(store) == 4


async def test_past_the_total_the_oldest_of_every_clients_goes() -> None:
    store = ResponseStore(4, 60.0, ManualClock(), stored_per_client=2)
    made = [stored(store, record(n, client=f"c{n}")) for n in range(6)]
    assert [r.id for r in made if store.get(r.id)] == ["resp_2", "resp_3", "resp_4", "resp_5"]
    assert len(store._kept) == 4  # nothing kept for a client whose responses all went


async def test_a_deleted_or_expired_response_frees_its_clients_share() -> None:
    clock = ManualClock()
    store = ResponseStore(10, 60.0, clock, stored_per_client=2)
    first, second = (stored(store, record(n, client="c")) for n in range(2))
    assert store.delete(first.id) and not store.delete(first.id)
    third = stored(store, record(2, client="c"))
    assert store.get(second.id) is second and store.get(third.id) is third  # none dropped
    clock.now += 60.0
    assert len(store) == 0 and store._kept == {}


async def test_stored_responses_expire_by_themselves() -> None:
    """Nothing reads the store (a read expires what is due: ``_stored`` is looked at instead),
    and its responses go at their TTL anyway."""
    store = ResponseStore(10, 0.05)
    for i in range(3):
        store.start(r := record(i))
        store.finish(r)
    assert len(store._stored) == 3
    await wait_until(lambda: not store._stored, 5.0, what="the stored responses expired")


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


async def test_a_follower_gets_the_events_the_response_emitted_byte_for_byte() -> None:
    answer = Answer("resp_1", "m", {"background": True}, status=Status.QUEUED)
    r = ResponseRecord(answer, "1", True, True, [])
    emitted: list[dict[str, Any]] = []

    async def emit(batch: list[dict[str, Any]]) -> None:
        emitted.extend(batch)
        r.emit(batch)
        await asyncio.sleep(0)  # let the follower run between the batches

    async def read(after: int) -> list[bytes]:
        got = [(number, chunk) async for number, chunk in r.follow(after)]
        assert [number for number, _ in got] == list(range(after + 1, after + 1 + len(got)))
        return [chunk for _, chunk in got]

    afters = (-1, 3, 5, 6, 7, 20)  # live followers resuming anywhere, past the deltas included
    lives = {after: asyncio.create_task(read(after)) for after in afters}
    await emit([r.events.created(), r.events.queued()])
    answer.status = Status.IN_PROGRESS  # as the run does
    await emit([r.events.in_progress()])
    answer.started_output = True
    await emit(r.events.output_started())
    for piece in ("one", " two", " é"):
        answer.text += piece
        answer.output_tokens += 1
        await emit([r.events.delta(piece)])
    answer.status, answer.input_tokens = Status.CANCELLED, 5
    await emit(r.events.ended())
    r.end()
    want = [encode(e) for e in emitted]
    assert [e["sequence_number"] for e in emitted] == list(range(len(emitted)))
    for after, live in lives.items():
        assert await live == want[after + 1 :], after
    for after in range(-1, len(want) + 1):  # replayed after the end
        assert await read(after) == want[after + 1 :], after
    assert b'"status": "cancelled"' in want[-1] and b"response.incomplete" in want[-1]


async def test_a_client_holds_at_most_its_share_of_background_responses() -> None:
    store = ResponseStore(10, 60.0, ManualClock(), background_per_client=2)

    def of(n: int, client: str) -> ResponseRecord:
        r = record(n, background=True)
        r.client = client
        return r

    mine = [of(1, "a"), of(2, "a")]
    for r in mine:
        store.start(r)
    with pytest.raises(TooManyRequests, match="2 background responses of this client"):
        store.start(of(3, "a"))
    store.start(of(4, "b"))  # another client's share is its own
    store.forget(mine[0])  # one that never ran gives its place back, as one that ended does
    store.start(of(5, "a"))
    with pytest.raises(TooManyRequests, match="--responses-background-per-client"):
        store.start(of(6, "a"))
    store.finish(mine[1])
    store.finish(mine[1])  # idempotent: a place is given back once
    store.start(of(7, "a"))
    with pytest.raises(TooManyRequests):
        store.start(of(8, "a"))
