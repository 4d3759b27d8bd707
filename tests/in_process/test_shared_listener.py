"""The shared listener's rule, on a real socket in one process: a process holding more
connections than a sibling leaves a new one to it, and takes it itself once that sibling took
nothing for ``PATIENCE_S`` (it is stalled or busy), a burst up to its share at first, then one,
two, four each time the sibling still takes none; a process that cannot accept (out of
descriptors) pauses instead of trying again at once."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bench.base.waiting import wait_until
from hangup_contract.runtime.shared_listener import PATIENCE_S, BalancedAcceptor, Board, queued


class _Taken(asyncio.Protocol):
    def __init__(self, made: asyncio.Queue[float]) -> None:
        self._made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made.put_nowait(time.monotonic())
        transport.close()


class _FailingSocket(socket.socket):
    """A listening socket whose ``accept`` fails as a process out of descriptors sees it."""

    attempts = 0

    def accept(self) -> Any:
        type(self).attempts += 1
        raise OSError(errno.EMFILE, "Too many open files")


@pytest.fixture
async def listening() -> AsyncIterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def _stalled_sibling(tmp_path: Path) -> Board:
    """A board of two slots: this process in 0, in 1 a sibling holding no connection that never
    accepts (stalled)."""
    board = Board.create(tmp_path / "board", 2)
    board.set_open(1, 0)
    return board


async def test_a_busier_process_leaves_a_connection_to_a_sibling_then_takes_it(
    listening: socket.socket, tmp_path: Path
) -> None:
    made: asyncio.Queue[float] = asyncio.Queue()
    board = _stalled_sibling(tmp_path)
    acceptor = BalancedAcceptor(listening, board, 0, lambda: _Taken(made), connections=lambda: 3)
    acceptor.start()
    try:
        opened = time.monotonic()
        _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
        taken = await asyncio.wait_for(made.get(), 5)
        writer.close()
        assert board.read()[1] == 1  # counted as accepted
    finally:
        acceptor.stop()
    # Holding 3 against the sibling's 0, it waited for the sibling first, then took it itself.
    assert taken - opened >= PATIENCE_S


async def test_a_burst_the_less_loaded_sibling_leaves_is_taken_up_to_a_share_then_doubling(
    listening: socket.socket, tmp_path: Path
) -> None:
    """After a wait in which the sibling took nothing, the running process takes what it lacks
    of an even share of everything open or queued, then one, two, four a wait: one a wait left
    four proxy workers at 0.02 of a core each taking one new connection a run window (half the
    events a second of up to 16 a wait), and taking every waiting connection after the first
    wait left four busy gateway API processes holding from 2 to 37 of 64 connections."""
    host, port = listening.getsockname()[:2]
    writers = [(await asyncio.open_connection(host, port))[1] for _ in range(8)]  # all queued
    await wait_until(lambda: queued(listening) == 8, what="8 connections queued")
    board = _stalled_sibling(tmp_path)
    seen: list[int] = []  # connections accepted in all, as each connection is made
    acceptor = BalancedAcceptor(
        listening, board, 0, lambda: _Counting(board, seen), connections=lambda: 3
    )
    acceptor.start()
    try:
        await wait_until(lambda: len(seen) == 8, what="every connection taken")
    finally:
        acceptor.stop()
        for writer in writers:
            writer.close()
    # Each batch after a wait of PATIENCE_S in which the stalled sibling took nothing: 3 (holding
    # 3 of 3 + 8, half is 6), then 2 (the doubling; half of 3 + 5 is 4, one short), then the last
    # 3; one at a time, then 2 and 4, before (1, 3, 3, 7, 7, 7, 7, 8).
    assert seen == [3, 3, 3, 5, 5, 8, 8, 8]


async def test_the_queue_of_a_listening_socket_is_counted(listening: socket.socket) -> None:
    host, port = listening.getsockname()[:2]
    assert queued(listening) == 0
    writers = [(await asyncio.open_connection(host, port))[1] for _ in range(3)]
    await wait_until(lambda: queued(listening) == 3, what="3 connections queued")
    listening.accept()[0].close()
    assert queued(listening) == 2
    for writer in writers:
        writer.close()


class _Counting(asyncio.Protocol):
    def __init__(self, board: Board, seen: list[int]) -> None:
        self._board = board
        self._seen = seen

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._seen.append(self._board.read()[1])
        transport.close()


async def test_a_process_out_of_descriptors_pauses_before_accepting_again(
    listening: socket.socket, tmp_path: Path
) -> None:
    failing = _FailingSocket(fileno=listening.detach())
    failing.setblocking(False)
    board = _stalled_sibling(tmp_path)
    acceptor = BalancedAcceptor(failing, board, 0, asyncio.Protocol, connections=lambda: 3)
    acceptor.start()
    try:
        _, writer = await asyncio.open_connection(*failing.getsockname()[:2])
        started = time.monotonic()
        await wait_until(lambda: _FailingSocket.attempts >= 3, what="three attempts")
        took = time.monotonic() - started
        writer.close()
    finally:
        acceptor.stop()
    # A 0.1 s pause after each failed attempt, not a step back of 2 ms and another try.
    assert took >= 0.15, f"3 attempts in {took:.3f} s"
