"""A stream's outbox: responses in order, bounded in bytes, the putters waiting beyond (no I/O)."""

from __future__ import annotations

import asyncio

from gateway_server.grpc.outbox import Outbox


async def test_responses_come_out_in_order_and_a_putter_waits_past_the_limit() -> None:
    box = Outbox(limit=10)
    await box.put(b"12345")
    await box.put(b"67890")  # now at the limit
    third = asyncio.create_task(box.put(b"abc"))
    await asyncio.sleep(0)
    assert not third.done() and box.held_bytes == 10
    assert await box.get() == b"12345"  # room again: the waiting putter goes on
    await asyncio.wait_for(third, 1)
    assert [await box.get(), await box.get()] == [b"67890", b"abc"]
    assert box.held_bytes == 0


async def test_one_response_larger_than_the_limit_still_passes() -> None:
    box = Outbox(limit=4)
    await asyncio.wait_for(box.put(b"x" * 100), 1)
    assert await box.get() == b"x" * 100


async def test_many_waiting_putters_hold_at_most_one_response_past_the_limit() -> None:
    box = Outbox(limit=10)
    await box.put(b"x" * 10)
    putters = [asyncio.create_task(box.put(bytes([i]) * 6)) for i in range(5)]
    await asyncio.sleep(0)
    taken = [await box.get()]
    for _ in range(5):
        await asyncio.sleep(0)
        assert box.held_bytes < 10 + 6
        taken.append(await box.get())
    await asyncio.gather(*putters)
    assert sorted(taken[1:]) == [bytes([i]) * 6 for i in range(5)]


async def test_close_ends_the_stream_after_what_is_held_and_frees_the_waiting() -> None:
    box = Outbox(limit=3)
    await box.put(b"abc")
    waiting = asyncio.create_task(box.put(b"late"))
    await asyncio.sleep(0)
    box.close()
    await asyncio.wait_for(waiting, 1)  # dropped: nobody will read it
    await box.put(b"later")  # likewise, at once
    assert await box.get() == b"abc"
    assert await box.get() is None and await box.get() is None


async def test_a_writer_waiting_for_a_response_wakes_for_one_or_for_the_end() -> None:
    box = Outbox(limit=10)
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    await box.put(b"hi")
    assert await asyncio.wait_for(getter, 1) == b"hi"
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.close()
    assert await asyncio.wait_for(getter, 1) is None
