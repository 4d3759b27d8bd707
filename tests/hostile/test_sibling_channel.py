"""The sibling channel (``hangup_contract/runtime/siblings.py``, the proxy's workers' and the
gateway's API processes' alike) under hostile messages.

- Its reader of a line (``sibling_lines.decode`` and the field readers) fed anything up to a
  question's bound (64 KiB) answers a message or ``Malformed`` (a ``ValueError``: never another
  exception, which would kill a connection's handler) within the hostile tier's CPU budget
  (``bench.harness.hostile.Budget``); its line cutter (``Lines``) looks at each byte once,
  however the bytes are cut.
- Live, on two channel ends over a real Unix socket: junk interleaved with good questions on one
  connection (a line past the bound, bytes that are no JSON, JSON that is no message, a known op
  with its fields missing or of the wrong kind): each bad message is skipped (answered with an
  error when it carries a sequence number) and every good question on the connection is
  answered, with the loop never held; a question too large to send fails alone, never breaking
  the connection the other calls' questions share; an answer too large becomes an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import ArmedLoop, Budget, timed
from hangup_contract.runtime.sibling_lines import (
    BOUNDS,
    Bounds,
    Lines,
    Message,
    decode,
    sequence,
    text,
)
from hangup_contract.runtime.siblings import Channel, SiblingUnreachable, socket_path
from tests.support.hostile_json import hostile_bytes, worst_bytes

LIMIT = BOUNDS.question
SMALL = Bounds(question=LIMIT, answer=4 * LIMIT)
BUDGET = Budget()
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOSTILE = settings(
    max_examples=60, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip


def _read(line: bytes) -> Message:
    """A question as both sides read one: the message, its number and its two text fields."""
    message = decode(line)
    sequence(message)
    text(message, "op")
    text(message, "id")
    return message


def _check_line(line: bytes) -> None:
    outcome = timed(_read, line)
    assert outcome.error is None or isinstance(outcome.error, ValueError), outcome.error
    BUDGET.check("a sibling line", len(line), outcome.spent)


@EXAMPLES
@given(line=hostile_bytes(LIMIT, ["n", "op", "id", "state"]))
def test_a_sibling_line_is_read_or_refused_as_malformed_within_budget(line: bytes) -> None:
    _check_line(line)


@pytest.mark.parametrize("what", list(worst_bytes(LIMIT)))
def test_a_sibling_line_at_its_limit(what: str) -> None:
    _check_line(worst_bytes(LIMIT)[what])


@EXAMPLES
@given(
    data=st.binary(max_size=3 * LIMIT) | st.integers(0, 3 * LIMIT).map(lambda n: b"x" * n),
    cuts=st.lists(st.integers(0, 3 * LIMIT), max_size=20),
)
def test_lines_are_cut_the_same_however_the_bytes_come_within_budget(
    data: bytes, cuts: list[int]
) -> None:
    data += b"\n"
    whole = timed(Lines(LIMIT).feed, data)
    assert whole.error is None
    BUDGET.check("sibling lines", len(data), whole.spent)
    expected = [line if len(line) <= LIMIT else None for line in data.split(b"\n")[:-1]]
    assert whole.result == expected
    lines, at, pieces = Lines(LIMIT), 0, []
    for cut in sorted({c for c in cuts if c < len(data)}):
        pieces.extend(lines.feed(data[at:cut]))
        at = cut
    pieces.extend(lines.feed(data[at:]))
    assert pieces == expected


class _Pair:
    """Two ends of a channel, the second answering claims inline and cancels once ``release`` is
    set (a cancel waits for its engines' abort)."""

    def __init__(self, directory: Path) -> None:
        log = logging.getLogger("hangup.test")
        self.asker = Channel(directory, "test", 0, 2, wait=5.0, log=log, bounds=SMALL)
        self.answerer = Channel(directory, "test", 1, 2, wait=5.0, log=log, bounds=SMALL)
        self.release = asyncio.Event()
        self.answerer.on("claim", lambda m: {"ok": True, "id": m["id"][:20]})
        self.answerer.on("echo", lambda m: {"echo": m["id"]})
        self.answerer.on_awaited("cancel", self._cancel)

    async def _cancel(self, message: Message) -> Message:
        await self.release.wait()
        return {"answer": {"id": message["id"]}}


@asynccontextmanager
async def pair(directory: Path) -> AsyncIterator[_Pair]:
    p = _Pair(directory)
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
        pending = asyncio.create_task(p.asker.ask(1, "cancel", {"id": "victim"}))
        assert (await p.asker.ask(1, "claim", {"id": "before"}))["ok"]  # connected, in flight
        with pytest.raises(SiblingUnreachable):
            await p.asker.ask(1, "claim", {"id": "é" * LIMIT})  # 6 bytes a character as JSON
        p.release.set()
        assert (await pending)["answer"] == {"id": "victim"}  # the other call's question
        assert (await p.asker.ask(1, "claim", {"id": "after"}))["ok"]


async def test_an_answer_too_large_is_an_error_and_the_connection_answers_the_others(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        pending = asyncio.create_task(p.asker.ask(1, "cancel", {"id": "victim"}))
        assert (await p.asker.ask(1, "echo", {"id": "x"}))["echo"] == "x"
        big = "x" * (LIMIT - 100)  # a question within its bound, its answer five times over it
        p.answerer.on("five", lambda m: {"echo": m["id"] * 5})
        assert (await p.asker.ask(1, "five", {"id": big}))["error"] == "answer too large"
        assert (await p.asker.ask(1, "echo", {"id": big}))["echo"] == big
        p.release.set()
        assert (await pending)["answer"] == {"id": "victim"}


JUNK = [
    b"[]", b"1", b'"claim"', b"null", b"{}", b'{"op": "claim"}', b'{"op": "claim", "n": 1}',
    b'{"op": "nope", "n": 2}', b'{"op": "claim", "n": "3", "id": "a"}',
    b'{"op": "claim", "n": true, "id": "a"}', b'{"op": "claim", "n": 4, "id": 5}',
    b'{"op": "cancel", "id": "a"}', b'{"op": ["claim"], "n": 6}', b'{"op": "claim", "n": -1}',
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


async def _interleaved(directory: Path, junk: list[list[bytes]]) -> None:
    """On one raw connection to the answering end: junk, a good claim, junk, a good claim, ...;
    every good claim is answered, in order, and the loop never stands."""
    async with pair(directory), ArmedLoop(stall_limit=0.5) as armed:
        path = socket_path(directory, "test", 1)
        reader, writer = await asyncio.open_unix_connection(path, limit=4 * LIMIT)
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
