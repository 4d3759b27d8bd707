"""The workers' sibling sockets (``proxy/calls/siblings.py``) under hostile peers, against a live
``python -m proxy --workers 2``: whatever a connection sends (not an object, nesting, the wrong
types, an overlong line, nothing at all for 5 times ``--cancel-attempt-timeout``), it closes
that connection alone, logs no error, and the worker answers the next question.

Before: a message that was not an object, or nested past the JSON parser's depth, raised in the
socket's handler (logged at error level with its traceback, the connection left open), and a
silent connection was held for ever.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.base.processes import children, environ_of
from bench.harness.stack import running_stack
from proxy.calls.siblings import socket_path

LINE_LIMIT = 64 * 1024  # the socket's longest line
WAIT = 1.0  # --cancel-attempt-timeout: a connection silent for 5 of these is closed

# Each a question's line (numbered "n") or not; "silence" sends nothing.
ATTACKS = {
    "an array": b"[]\n",
    "a number": b"7\n",
    "a string": b'"cancel"\n',
    "nesting": b"[" * 100_000 + b"\n",
    "nested in an object": b'{"n": "1", "op": "cancel", "id": ' + b'{"a": ' * 50_000 + b"\n",
    "an id that is not a string": b'{"n": "1", "op": "cancel", "id": ["x"]}\n',
    "an unknown question": b'{"n": "1", "op": "shutdown", "id": "x"}\n',
    "not UTF-8": b'{"n": "1", "op": "cancel", "id": "\xff\xfe"}\n',
    "an overlong line": b'{"n": "1", "op": "cancel", "id": "' + b"x" * (LINE_LIMIT + 10) + b'"}\n',
    "silence": b"",
}


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if '"level": "ERROR"' in line or "Traceback" in line]


async def _closed_within(path: Path, sent: bytes, within: float) -> bytes:
    """What the socket answers ``sent`` with, up to its closing (fails if it stays open)."""
    reader, writer = await asyncio.open_unix_connection(path, limit=4 * LINE_LIMIT)
    try:
        async with asyncio.timeout(within):
            writer.write(sent)
            await writer.drain()
            return await reader.read()  # to the end: the peer closed
    except ConnectionError:  # closed with what was sent unread: closed all the same
        return b""
    finally:
        writer.close()


async def _answer(path: Path, question: bytes) -> bytes:
    """The one line the socket answers ``question`` with (the connection then closed here)."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(question)
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_a_hostile_peer_closes_only_its_own_connection(tmp_path: Path) -> None:
    args = ["--workers", "2", "--cancel-attempt-timeout", str(WAIT)]
    with running_stack(tmp_path, [], args) as stack:
        worker = children(stack.proxy.popen.pid)[0]
        env = environ_of(worker)
        path = socket_path(Path(env["PROMETHEUS_MULTIPROC_DIR"]), int(env["HANGUP_PROXY_WORKER"]))
        answered = {}
        for what, sent in ATTACKS.items():
            try:
                answer = await _closed_within(path, sent, within=5 * WAIT + 5)
            except TimeoutError:
                answer = b"(still open)"
            if answer:
                answered[what] = answer[:200]
        good = b'{"n": "7", "op": "cancel", "id": "nobody"}\n'
        answer = await _answer(path, good)
        assert json.loads(answer) == {"n": "7", "state": "not_held"}
        assert (answered, _errors(stack.proxy.log())) == ({}, [])


@pytest.mark.parametrize("op", ["held", "bury", "unbury"])
async def test_every_question_has_an_answer(tmp_path: Path, op: str) -> None:
    """``held`` (a trusted id's call asks it), ``bury`` (the cancel waits for every worker's
    tombstone) and ``unbury`` each answer a state."""
    with running_stack(tmp_path, [], ["--workers", "2"]) as stack:
        env = environ_of(children(stack.proxy.popen.pid)[0])
        path = socket_path(Path(env["PROMETHEUS_MULTIPROC_DIR"]), int(env["HANGUP_PROXY_WORKER"]))
        question = json.dumps({"n": "1", "op": op, "id": "some-id"}).encode() + b"\n"
        answer = json.loads(await _answer(path, question))
    assert answer == {
        "n": "1",
        "state": {"held": "free", "bury": "buried", "unbury": "unburied"}[op],
    }
