"""The workers' sibling sockets (the sibling channel, ``hangup_contract/runtime/siblings.py``,
as ``proxy/calls/siblings.py`` serves it) under hostile peers, against a live ``python -m proxy
--workers 2``: whatever a connection sends (not an object, nesting, the wrong types, an unknown
question, an overlong line), that message alone is skipped (answered ``{"error": "malformed"}``
when it names a question's number), no error is logged, and the worker answers the next
question on the same connection; a connection that sends nothing for 5 times
``--cancel-attempt-timeout`` is closed.

Before issue 59: a message that was not an object, or nested past the JSON parser's depth,
raised in the socket's handler (logged at error level with its traceback, the connection left
open), and a silent connection was held for ever. Before issue 64 each of them closed the
connection it came on, with every question still on it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.base.processes import children, environ_of
from bench.harness.stack import running_stack
from proxy.calls.siblings import socket_path

LINE_LIMIT = 64 * 1024  # a question's longest line
WAIT = 1.0  # --cancel-attempt-timeout: a connection silent for 5 of these is closed

# Each a line that is no good question (numbered 1 where it is one at all).
ATTACKS = {
    "an array": b"[]\n",
    "a number": b"7\n",
    "a string": b'"cancel"\n',
    "nesting": b"[" * 100_000 + b"\n",
    "nested in an object": b'{"n": 1, "op": "cancel", "id": ' + b'{"a": ' * 50_000 + b"\n",
    "an id that is not a string": b'{"n": 1, "op": "held", "id": ["x"]}\n',
    "a number that is not a number": b'{"n": "1", "op": "cancel", "id": "x"}\n',
    "an unknown question": b'{"n": 1, "op": "shutdown", "id": "x"}\n',
    "not UTF-8": b'{"n": 1, "op": "cancel", "id": "\xff\xfe"}\n',
    "an overlong line": b'{"n": 1, "op": "cancel", "id": "' + b"x" * (LINE_LIMIT + 10) + b'"}\n',
}
GOOD = b'{"n": 7, "op": "cancel", "id": "nobody"}\n'


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if '"level": "ERROR"' in line or "Traceback" in line]


async def _answers_after(path: Path, attack: bytes) -> list[dict[str, object]]:
    """What the socket answers ``attack`` and then a good question on the same connection,
    up to the good question's answer."""
    reader, writer = await asyncio.open_unix_connection(path, limit=4 * LINE_LIMIT)
    answers: list[dict[str, object]] = []
    try:
        writer.write(attack + GOOD)
        await writer.drain()
        while not answers or answers[-1].get("n") != 7:
            answers.append(json.loads(await asyncio.wait_for(reader.readline(), 10)))
    finally:
        writer.close()
    return answers


async def _answer(path: Path, question: bytes) -> bytes:
    """The one line the socket answers ``question`` with (the connection then closed here)."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(question)
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def _closed_within(path: Path, within: float) -> bytes:
    """What the socket sends a connection that sends nothing, up to its closing (fails if it
    stays open)."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        async with asyncio.timeout(within):
            return await reader.read()  # to the end: the peer closed
    finally:
        writer.close()


async def test_a_hostile_message_is_skipped_alone_and_a_silent_peer_closed(tmp_path: Path) -> None:
    args = ["--workers", "2", "--cancel-attempt-timeout", str(WAIT)]
    with running_stack(tmp_path, [], args) as stack:
        worker = children(stack.proxy.popen.pid)[0]
        env = environ_of(worker)
        path = socket_path(Path(env["PROMETHEUS_MULTIPROC_DIR"]), int(env["HANGUP_PROXY_WORKER"]))
        answered = {what: await _answers_after(path, sent) for what, sent in ATTACKS.items()}
        assert await _closed_within(path, within=5 * WAIT + 5) == b""
        log = stack.proxy.log()
    for what, answers in answered.items():
        *skipped, good = answers
        assert good == {"n": 7, "state": "not_held"}, what
        assert all(a == {"n": 1, "error": "malformed"} for a in skipped), (what, skipped)
    malformed = [w for w, answers in answered.items() if len(answers) == 2]
    assert malformed == ["an id that is not a string", "an unknown question"]
    assert _errors(log) == []


@pytest.mark.parametrize("op", ["held", "bury", "unbury"])
async def test_every_question_has_an_answer(tmp_path: Path, op: str) -> None:
    """``held`` (a trusted id's call asks it), ``bury`` (the cancel waits for every worker's
    tombstone) and ``unbury`` each answer a state."""
    with running_stack(tmp_path, [], ["--workers", "2"]) as stack:
        env = environ_of(children(stack.proxy.popen.pid)[0])
        path = socket_path(Path(env["PROMETHEUS_MULTIPROC_DIR"]), int(env["HANGUP_PROXY_WORKER"]))
        question = json.dumps({"n": 1, "op": op, "id": "some-id"}).encode() + b"\n"
        answer = json.loads(await _answer(path, question))
    assert answer == {
        "n": 1,
        "state": {"held": "free", "bury": "buried", "unbury": "unburied"}[op],
    }
