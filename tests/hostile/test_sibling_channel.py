"""The channel between API processes under hostile messages: a line past the limit, bytes that are
no JSON, JSON that is no message, a known ``op`` with its fields missing or of the wrong kind.
Each bad message is skipped (answered with an error when it carries a sequence number) and the
connection it came on goes on answering every other question, with the loop never held; a
question too large to send fails alone, never breaking the connection the other calls' questions
share (``gateway_server/siblings/channel.py``). The line limit is made small here (64 KiB) so
that the limit's cases cost little; the code reads it wherever it applies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import ArmedLoop
from gateway_server.siblings import channel as channel_module
from gateway_server.siblings.channel import Channel, Message, Op, SiblingUnreachable
from gateway_server.siblings.processes import ApiProcess

LIMIT = 64 * 1024
HOSTILE = settings(
    max_examples=60, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip


@pytest.fixture(autouse=True)
def small_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_module, "LINE_LIMIT", LIMIT)


class _Pair:
    """Two API processes' channels, the second answering claims inline and cancels once
    ``release`` is set (a cancel waits for its engines' abort)."""

    def __init__(self, run_dir: Path) -> None:
        self.asker = Channel(ApiProcess(0, 2, run_dir, restarted=False))
        self.answerer = Channel(ApiProcess(1, 2, run_dir, restarted=False))
        self.release = asyncio.Event()
        self.answerer.on(Op.CLAIM, lambda m: {"ok": True, "id": m["id"][:20]})
        self.answerer.on_awaited(Op.CANCEL, self._cancel)

    async def _cancel(self, message: Message) -> Message:
        await self.release.wait()
        return {"answer": {"id": message["id"]}}


@asynccontextmanager
async def pair(run_dir: Path) -> AsyncIterator[_Pair]:
    p = _Pair(run_dir)
    await p.answerer.listen()
    await p.asker.listen()
    try:
        yield p
    finally:
        p.release.set()
        await p.asker.close()
        await p.answerer.close()


async def test_a_question_too_large_fails_alone_and_the_connection_answers_the_others(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        pending = asyncio.create_task(p.asker.ask(1, Op.CANCEL, {"id": "victim", "reason": "x"}))
        assert (await p.asker.ask(1, Op.CLAIM, {"id": "before"}))["ok"]  # connected, in flight
        with pytest.raises(SiblingUnreachable):
            await p.asker.ask(1, Op.CLAIM, {"id": "é" * LIMIT})  # 6 bytes a character as JSON
        p.release.set()
        assert (await pending)["answer"] == {"id": "victim"}  # the other call's question
        assert (await p.asker.ask(1, Op.CLAIM, {"id": "after"}))["ok"]


JUNK = [
    b"[]", b"1", b'"claim"', b"null", b"{}", b'{"op": "claim"}', b'{"op": "claim", "n": 1}',
    b'{"op": "nope", "n": 2}', b'{"op": "claim", "n": "3", "id": "a"}',
    b'{"op": "claim", "n": true, "id": "a"}', b'{"op": "claim", "n": 4, "id": 5}',
    b'{"op": "cancel", "id": "a"}', b'{"op": ["claim"], "n": 6}',
    b"[" * 5000 + b"]" * 5000, b'{"op": "claim", "n": 1' + b"0" * 5000 + b', "id": "a"}',
]  # fmt: skip
junk_lines = st.one_of(
    st.binary(max_size=200).filter(lambda b: b"\n" not in b),
    st.integers(LIMIT - 10, 3 * LIMIT).map(lambda n: b"x" * n),  # past the limit, or just under
    st.sampled_from(JUNK),
)


@HOSTILE
@given(st.lists(st.lists(junk_lines, max_size=3), min_size=1, max_size=4))
def test_bad_messages_are_skipped_and_every_good_question_on_the_connection_is_answered(
    tmp_path_factory: pytest.TempPathFactory, junk: list[list[bytes]]
) -> None:
    asyncio.run(_interleaved(tmp_path_factory.mktemp("channel"), junk))


async def _interleaved(run_dir: Path, junk: list[list[bytes]]) -> None:
    """On one raw connection to the answering process: junk, a good claim, junk, a good claim,
    ...; every good claim is answered, in order, and the loop never stands."""
    async with pair(run_dir), ArmedLoop(stall_limit=0.5) as armed:
        reader, writer = await asyncio.open_unix_connection(run_dir / "api-1.sock", limit=4 * LIMIT)
        try:
            for i, lines in enumerate(junk):
                for line in lines:
                    writer.write(line + b"\n")
                good = {"op": "claim", "n": 1000 + i, "id": f"good-{i}"}
                writer.write(json.dumps(good).encode() + b"\n")
            await writer.drain()
            answers = []
            while len(answers) < len(junk):
                answer = json.loads(await asyncio.wait_for(reader.readline(), 5.0))
                if answer.get("n", 0) >= 1000:
                    answers.append(answer)
                else:
                    assert answer.get("error") == "malformed", answer
        finally:
            writer.close()
            await writer.wait_closed()
    assert [a["id"] for a in answers] == [f"good-{i}" for i in range(len(junk))]
    armed.check()
