"""The sibling channel's connections (:mod:`hangup_contract.runtime.siblings`), both ends as
protocol callbacks: :class:`Asking`, this process's connection to a sibling's socket (its
questions by number, waiting for their answers in any order), opened by a :class:`Peer` when
first asked; :class:`Answering`, a sibling's connection to this process's socket (each question
answered inline or from a task, reading paused while its answers are left unread). Each reads
lines with :class:`~hangup_contract.runtime.sibling_lines.Lines` and logs the first thing wrong
on it; :class:`Quiet` is the one timer that closes a connection idle or silent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.sibling_lines import (
    Lines,
    Malformed,
    Message,
    MessageTooLarge,
    decode,
    encode,
    sequence,
)

if TYPE_CHECKING:
    from hangup_contract.runtime.siblings import AwaitedHandler, Channel

ENDED = "the connection ended before the answer"
Reply = Message | str  # an answer, or why there is none (``ENDED``: ask once more)


class SiblingUnreachable(Exception):
    """A sibling did not answer: past the deadline, not reading, or not there."""


class SiblingNotRunning(SiblingUnreachable):
    """A sibling's socket is missing or refuses: it is restarting, or gone."""


class Quiet:
    """Calls ``then`` once ``touch`` was not called for ``after`` seconds: one timer, moved only
    when it fires (a message costs a clock read, not a timer)."""

    def __init__(self, after: float, then: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._after, self._then = after, then
        self._last = self._loop.time()
        self._timer = self._loop.call_later(after, self._check)

    def touch(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        quiet = self._loop.time() - self._last
        if quiet >= self._after:
            self._then()
        else:
            self._timer = self._loop.call_later(self._after - quiet, self._check)

    def stop(self) -> None:
        self._timer.cancel()


class End(asyncio.Protocol):
    """A connection of the channel, either end: lines in, complaints logged once."""

    transport: asyncio.Transport

    def __init__(self, channel: Channel, limit: int) -> None:
        self._channel = channel
        self._lines = Lines(limit)
        self._complaints = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (idempotent: see Peer._open) uvloop's transports are not asyncio.Transport's
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.lines(self._lines.feed(data))

    def lines(self, lines: list[bytes | None]) -> None:
        for line in lines:
            if line is None:
                self.complain("sibling_line_too_long", "a line over its bound, skipped")
                continue
            try:
                message = decode(line)
            except Malformed as exc:
                self.complain("sibling_message_malformed", str(exc))
                continue
            self.message(message)

    def message(self, message: Message) -> None:
        raise NotImplementedError

    def complain(self, event: str, why: str) -> None:
        """Log the first thing wrong on this connection; count the rest."""
        self._complaints += 1
        if self._complaints == 1:
            log_event(self._channel.log, event, logging.WARNING, error=why[:200])

    def connection_lost(self, exc: Exception | None) -> None:
        if self._complaints > 1:
            log_event(
                self._channel.log, "sibling_messages_skipped", logging.WARNING,
                count=self._complaints,
            )  # fmt: skip


class Asking(End):
    """This process's connection to a sibling's socket: its questions, by number, waiting for
    their answers (in any order)."""

    def __init__(self, channel: Channel, peer: Peer) -> None:
        super().__init__(channel, channel.bounds.answer)
        self._peer = peer
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self._quiet = Quiet(channel.idle, self._idle)

    def send(self, n: int | None, line: bytes) -> asyncio.Future[Reply]:
        """Write a question (``n``) or a notice (None: answered at once, with ``{}``)."""
        answer: asyncio.Future[Reply] = self._channel.loop.create_future()
        transport = self.transport
        if transport.is_closing():
            answer.set_result(ENDED)
        elif transport.get_write_buffer_size() > self._channel.bounds.unsent:
            answer.set_result("its questions are not read")
        else:
            transport.write(line)
            self._quiet.touch()
            if n is None:
                answer.set_result({})
            else:
                self.pending[n] = answer
        return answer

    def message(self, message: Message) -> None:
        n = message.get("n")
        answer = self.pending.pop(n, None) if type(n) is int else None
        if answer is not None and not answer.done():
            answer.set_result(message)

    def _idle(self) -> None:
        if self.pending:
            self._quiet = Quiet(self._channel.idle, self._idle)
        else:
            self._peer.ended(self)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._quiet.stop()
        self._peer.ended(self)
        for answer in self.pending.values():
            if not answer.done():
                answer.set_result(ENDED)
        self.pending.clear()


class Peer:
    """The connection to one sibling, opened when first asked (by one question while the others
    wait for it)."""

    def __init__(self, channel: Channel, path: Path) -> None:
        self._channel = channel
        self.path = path
        self._connection: Asking | None = None
        self._opening = asyncio.Lock()

    def send(self, n: int | None, line: bytes) -> asyncio.Future[Reply]:
        """The answer to come. No task while a connection is open."""
        connection = self._connection
        if connection is None:
            return asyncio.ensure_future(self._opened_send(n, line))
        return connection.send(n, line)

    async def _opened_send(self, n: int | None, line: bytes) -> Reply:
        """Raises SiblingNotRunning, or SiblingUnreachable when it cannot connect otherwise."""
        async with self._opening:
            connection = self._connection
            if connection is None:
                try:
                    transport, connection = await self._channel.loop.create_unix_connection(
                        lambda: Asking(self._channel, self), str(self.path)
                    )
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    raise SiblingNotRunning(f"{self.path.name}: not running") from exc
                except OSError as exc:
                    raise SiblingUnreachable(f"{self.path.name}: {exc}") from exc
                connection.connection_made(transport)  # uvloop may call it only after this
                self._connection = connection
        return await connection.send(n, line)

    def forget(self, n: int) -> None:
        """Question ``n`` is no longer awaited (answered, timed out or cancelled)."""
        if self._connection is not None:
            self._connection.pending.pop(n, None)

    def ended(self, connection: Asking) -> None:
        if self._connection is connection:
            self._connection = None

    def close(self) -> None:
        if self._connection is not None:
            end_connection(self._connection.transport)


class Answering(End):
    """A sibling's connection to this process's socket: each question answered (inline, or from
    a task once ready); read no more while its answers are left unread; closed when silent."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel, channel.bounds.question)
        self._owed = 0  # answers being made by tasks
        self._paused = False  # its answers are left unread
        self._waiting: list[bytes | None] = []  # lines read before it was paused
        self._quiet = Quiet(channel.silence, self._silent)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._channel.serving.add(self)

    def data_received(self, data: bytes) -> None:
        self._quiet.touch()
        super().data_received(data)

    def lines(self, lines: list[bytes | None]) -> None:
        """Each line's message, until its answers are left unread: the rest then wait for
        :meth:`resume_writing` (at most what one read brought)."""
        for at in range(len(lines)):
            if self._paused:
                self._waiting = lines[at:]
                return
            super().lines(lines[at : at + 1])

    def message(self, message: Message) -> None:
        try:
            n = sequence(message)
        except Malformed as exc:
            self.complain("sibling_message_malformed", str(exc))
            return
        channel, op = self._channel, message.get("op")
        awaited = channel.awaited.get(op) if isinstance(op, str) else None
        if awaited is not None:
            self._owed += 1
            channel.spawn(self._answer_later(n, awaited, message))
            return
        handler = channel.handlers.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise Malformed(f"no such op: {str(op)[:50]!r}")
            reply = handler(message)
        except (ValueError, KeyError, TypeError) as exc:
            self.complain("sibling_message_malformed", repr(exc))
            reply = {"error": "malformed"}
        self._reply(n, reply)

    async def _answer_later(self, n: int | None, handler: AwaitedHandler, message: Message) -> None:
        try:
            reply = await handler(message)
        except (ValueError, KeyError, TypeError) as exc:
            self.complain("sibling_message_malformed", repr(exc))
            reply = {"error": "malformed"}
        except Exception as exc:  # a fault of this process's own: said, and answered
            self._channel.log.exception(
                "sibling_answer_failed", extra={"fields": {"op": message.get("op")}}
            )
            reply = {"error": "failed", "message": str(exc)[:200]}
        finally:
            self._owed -= 1
            self._quiet.touch()
        self._reply(n, reply)

    def _reply(self, n: int | None, reply: Message) -> None:
        if n is None or self.transport.is_closing():
            return  # a notice: no answer
        try:
            line = encode({**reply, "n": n}, self._channel.bounds.answer)
        except MessageTooLarge as exc:
            self.complain("sibling_answer_too_large", str(exc))
            line = encode({"error": "answer too large", "n": n}, self._channel.bounds.answer)
        self.transport.write(line)

    def pause_writing(self) -> None:
        self._paused = True  # its answers are not read: read none of its questions
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        waiting, self._waiting = self._waiting, []
        self.lines(waiting)
        if not self._paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def _silent(self) -> None:
        if self._owed:
            self._quiet = Quiet(self._channel.silence, self._silent)
            return
        silence = self._channel.silence
        log_event(self._channel.log, "sibling_connection_silent", logging.WARNING, after=silence)
        # Aborted, not closed: a silent sibling reads nothing either, and a close may wait to
        # flush what it never reads (under CI's load a close, logged silent, had not ended the
        # connection 5 s later, on uvloop).
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._quiet.stop()
        self._channel.serving.discard(self)


def end_connection(transport: asyncio.Transport) -> None:
    """Close a connection: at once when what it has to write waits unread (a close would wait
    for the other side to read it, and uvloop's loop would not close meanwhile)."""
    if transport.get_write_buffer_size():
        transport.abort()
    else:
        transport.close()
