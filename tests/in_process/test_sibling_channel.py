"""The sibling channel (``hangup_contract/runtime/siblings.py``) between channel ends in this
process, over real Unix sockets, on asyncio's loop and on uvloop (the loop both servers run
on): asking one sibling, every sibling and an id's home; notices; a sibling that stops and one
that restarts in its slot; a sibling that never answers and one that never reads; the clocks
that close a connection idle or silent, and never one that is owed an answer; backpressure on
answers left unread. The same channel under hostile messages: ``hostile/test_sibling_channel.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import pytest
import uvloop

from bench.base.waiting import wait_until
from hangup_contract.runtime.sibling_lines import Bounds, Message
from hangup_contract.runtime.siblings import (
    Channel,
    SiblingNotRunning,
    SiblingUnreachable,
    home_of,
    socket_path,
)

LOG = logging.getLogger("hangup.test.siblings")
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[None]], None]:
    """Runs a scenario to its end in a loop of the kind the test is for, within 20 s."""

    def run(scenario: Awaitable[None]) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(20):
                await scenario

        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(bounded())

    return run


def end(directory: Path, slot: int, count: int = 3, wait: float = 2.0, **bounds: int) -> Channel:
    """Channel end ``slot`` of ``count``, answering ``whoami`` (its slot and the id asked),
    ``slow`` (after ``seconds``) and the notice ``note`` (kept in ``notes``)."""
    channel = Channel(directory, "t", slot, count, wait=wait, log=LOG, bounds=Bounds(**bounds))
    notes: list[str] = []
    channel.notes = notes  # type: ignore[attr-defined]
    channel.on("whoami", lambda m: {"slot": slot, "id": m.get("id")})
    channel.on("note", lambda m: notes.append(m["id"]) or {})

    async def slow(message: Message) -> Message:
        await asyncio.sleep(message["seconds"])
        return {"slept": message["seconds"]}

    channel.on_awaited("slow", slow)
    return channel


@asynccontextmanager
async def ends(directory: Path, count: int = 3, wait: float = 2.0) -> AsyncIterator[list[Channel]]:
    channels = [end(directory, slot, count, wait) for slot in range(count)]
    for channel in channels:
        await channel.listen()
    try:
        yield channels
    finally:
        for channel in channels:
            await channel.close()


def test_one_sibling_every_sibling_and_an_ids_home(run: Callable, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ends(tmp_path) as (first, second, third):
            assert (await first.ask(2, "whoami", {"id": "a"}))["slot"] == 2
            answers = await second.ask_all("whoami", {"id": "b"})
            assert {s: a["slot"] for s, a in answers.answered.items()} == {0: 0, 2: 2}
            assert answers.not_running == [] and answers.silent == {}
            rid = next(f"id-{i}" for i in range(100) if home_of(f"id-{i}", 3) == 1)
            assert first.home(rid) == 1 == third.home(rid)
            assert (await third.ask(third.home(rid), "whoami", {"id": rid}))["slot"] == 1
            first.tell(1, "note", {"id": "one"})
            first.tell_all("note", {"id": "all"})
            await wait_until(
                lambda: sorted(second.notes) == ["all", "one"] and third.notes == ["all"]
            )

    run(scenario())


def test_questions_on_one_connection_are_answered_in_any_order(
    run: Callable, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with ends(tmp_path, 2) as (first, _):
            slow = asyncio.ensure_future(first.ask(1, "slow", {"seconds": 0.3}))
            fast = [first.ask(1, "whoami", {"id": str(i)}) for i in range(50)]
            answers = await asyncio.gather(*fast)
            assert not slow.done()  # every quick answer came past the slow one
            assert [a["id"] for a in answers] == [str(i) for i in range(50)]
            assert (await slow)["slept"] == 0.3

    run(scenario())


def test_a_sibling_that_stops_is_not_running_and_is_reached_again_once_restarted(
    run: Callable, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with ends(tmp_path) as (first, second, third):
            assert (await first.ask(1, "whoami"))["slot"] == 1  # a connection kept to it
            pending = asyncio.ensure_future(first.ask(1, "slow", {"seconds": 10}))
            await wait_until(lambda: second.serving and second._tasks)
            await second.close()  # it dies with a question of ours in flight
            started = time.monotonic()
            with pytest.raises(SiblingNotRunning):
                await pending  # at once, not at the deadline: asked again, nobody there
            assert time.monotonic() - started < 1.0
            answers = await first.ask_all("whoami")
            assert answers.not_running == [1] and set(answers.answered) == {2}
            again = end(tmp_path, 1)  # the slot's next life
            await again.listen()
            try:
                assert (await first.ask(1, "whoami"))["slot"] == 1
                assert set((await third.ask_all("whoami")).answered) == {0, 1}
            finally:
                await again.close()

    run(scenario())


class _Mute:
    """A socket that accepts, and never answers (never reads, unless ``read``)."""

    def __init__(self, read: bool) -> None:
        self._read = read
        self._server: asyncio.AbstractServer | None = None
        self._transports: list[asyncio.BaseTransport] = []

    async def listen(self, path: Path) -> _Mute:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: self._Held(self), str(path))
        return self

    class _Held(asyncio.Protocol):
        def __init__(self, mute: _Mute) -> None:
            self._mute = mute

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self._transport = cast(asyncio.Transport, transport)
            self._mute._transports.append(transport)

        def data_received(self, data: bytes) -> None:
            if not self._mute._read:  # (uvloop starts reading after connection_made)
                self._transport.pause_reading()

    def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for transport in self._transports:
            transport.close()


async def _mute(path: Path, read: bool) -> _Mute:
    return await _Mute(read).listen(path)


def test_a_silent_sibling_is_timed_out_and_the_others_answer(run: Callable, tmp_path: Path) -> None:
    async def scenario() -> None:
        first, third = end(tmp_path, 0, wait=0.3), end(tmp_path, 2, wait=0.3)
        await third.listen()
        mute = await _mute(socket_path(tmp_path, "t", 1), read=True)
        try:
            started = time.monotonic()
            with pytest.raises(SiblingUnreachable, match=r"no answer within 0\.3 s"):
                await first.ask(1, "whoami")
            answers = await first.ask_all("whoami")
            assert time.monotonic() - started < 2.0
            assert set(answers.answered) == {2} and list(answers.silent) == [1]
        finally:
            mute.close()
            await first.close()
            await third.close()

    run(scenario())


def test_a_sibling_that_never_reads_fails_questions_at_once_past_the_unsent_bound(
    run: Callable, tmp_path: Path
) -> None:
    async def scenario() -> None:
        first = end(tmp_path, 0, count=2, wait=0.05, unsent=4096)
        mute = await _mute(socket_path(tmp_path, "t", 1), read=False)
        try:
            big = {"id": "x" * 60_000}
            why = ""
            for _ in range(200):  # the socket's buffers first, then ours
                started = time.monotonic()
                try:
                    await first.ask(1, "whoami", big)
                except SiblingUnreachable as exc:
                    why = str(exc)
                if "not read" in why:
                    break
            assert "its questions are not read" in why
            assert time.monotonic() - started < 0.05  # at once, not at the deadline
        finally:
            mute.close()
            await first.close()

    run(scenario())


def test_the_asker_closes_an_idle_connection_and_the_listener_a_silent_one(
    run: Callable, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with ends(tmp_path, 2, wait=0.1) as (first, second):
            assert (await first.ask(1, "whoami"))["slot"] == 1
            assert len(second.serving) == 1
            await wait_until(lambda: not second.serving, within=2, what="idle closed")
            assert (await first.ask(1, "whoami"))["slot"] == 1  # opened again
            # Owed an answer for longer than 5 waits: never closed for silence.
            assert (await first.ask(1, "slow", {"seconds": 1.0}, wait=3))["slept"] == 1.0
            reader, writer = await asyncio.open_unix_connection(socket_path(tmp_path, "t", 1))
            started = time.monotonic()
            assert await reader.read() == b""  # a raw connection that sends nothing: closed
            assert 0.4 < time.monotonic() - started < 3
            writer.close()

    run(scenario())


def test_a_malformed_line_is_skipped_alone(run: Callable, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ends(tmp_path, 2) as (first, _):
            reader, writer = await asyncio.open_unix_connection(socket_path(tmp_path, "t", 1))
            writer.write(b'{"n": 1, "op"\n[1]\n{"n": 2, "op": "nope"}\n{"n": 3, "op": "whoami"}\n')
            answers = [json.loads(await reader.readline()) for _ in range(2)]
            assert answers == [{"n": 2, "error": "malformed"}, {"n": 3, "slot": 1, "id": None}]
            assert (await first.ask(1, "whoami"))["slot"] == 1  # another connection: untouched
            writer.close()

    run(scenario())


def test_answers_left_unread_stop_the_reading_of_that_connection_alone(
    run: Callable, tmp_path: Path
) -> None:
    async def scenario() -> None:
        first, second = end(tmp_path, 0, count=2, wait=5.0), end(tmp_path, 1, count=2, wait=0.3)
        await second.listen()
        asked: list[int] = []
        second.on("big", lambda m: asked.append(1) or {"x": "x" * 50_000})
        _, writer = await asyncio.open_unix_connection(socket_path(tmp_path, "t", 1))
        try:
            for n in range(5000):  # 250 MB of answers, were they all made: never read
                writer.write(json.dumps({"n": n, "op": "big"}).encode() + b"\n")
            await wait_until(lambda: asked)
            assert (await first.ask(1, "whoami"))["slot"] == 1  # the others are answered
            assert 0 < len(asked) < 100
            assert len(second.serving) == 2
            # Not read from, so silent: closed after 5 waits (1.5 s).
            await wait_until(lambda: len(second.serving) == 1, within=5, what="closed")
            assert len(asked) < 100
            assert (await first.ask(1, "whoami"))["slot"] == 1
        finally:
            writer.close()
            await first.close()
            await second.close()

    run(scenario())
