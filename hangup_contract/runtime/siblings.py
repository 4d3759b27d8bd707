"""One sibling channel: how the processes of one server ask one another, over Unix sockets.

The proxy's workers (``--workers``) and the gateway's API processes (``--api-processes``) each
serve a socket ``<prefix>-<slot>.sock`` in their supervisor's private directory and keep one
connection to each sibling's, opened when first asked and kept while questions come. Messages
are JSON lines (:mod:`hangup_contract.runtime.sibling_lines`); each side's ops are its own
vocabulary, registered with :meth:`Channel.on` (answered inline, in order) or
:meth:`Channel.on_awaited` (answered from a task once ready: a cancel waits for its engines).
Both ends are protocol callbacks: while a connection is open, a question costs no task and no
stream reader (the proxy asks on a call's way upstream).

- Asking: :meth:`Channel.ask` (one sibling: an id's home, :meth:`Channel.home`),
  :meth:`Channel.ask_all` (every sibling at once, all within one deadline), :meth:`Channel.tell`
  (a notice, not answered). A sibling whose socket is missing or refuses is
  :class:`SiblingNotRunning` (restarting: what it held died with it); one that does not answer
  in time is :class:`SiblingUnreachable`. A question whose connection ended before its answer
  is asked once more on a fresh one (the sibling restarted), within the same deadline.
- One exchange at a time goes wrong, never the connection others share, never the process: a
  line past its bound is skipped to its end; a message that is no message (not JSON, nested past
  the reader, no object, a sequence number that is no number) is skipped, one with a usable
  sequence number but an unknown op or a bad field is answered ``{"error": "malformed"}``; a
  question or an answer too large is never written (the question fails alone, the answer
  becomes ``{"error": "answer too large"}``). Each is logged once a connection (a warning), and
  how many there were when it closes.
- Time: the asker closes a connection after 2 waits with no question and none pending, the
  listener one that sent no line for 5 waits while it owes no answer (so a question never meets
  a connection its listener is closing). Backpressure: a sibling that leaves answers unread is
  not read from (its socket's buffers fill; its questions wait there), and is then silent; an
  asker whose questions are not read (``Bounds.unsent``) fails the next at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.sibling_lines import (
    BOUNDS,
    Bounds,
    Lines,
    Malformed,
    Message,
    MessageTooLarge,
    decode,
    encode,
    sequence,
)

Handler = Callable[[Message], Message]
"""Answers a message inline (a notice's answer is dropped)."""
AwaitedHandler = Callable[[Message], Awaitable[Message]]
"""Answers a message from a task of its own."""

_ENDED = "the connection ended before the answer"
_Reply = Message | str  # an answer, or why there is none (``_ENDED``: ask once more)


class SiblingUnreachable(Exception):
    """A sibling did not answer: past the deadline, not reading, or not there."""


class SiblingNotRunning(SiblingUnreachable):
    """A sibling's socket is missing or refuses: it is restarting, or gone."""


def home_of(key: str, count: int) -> int:
    """The sibling whose memory holds ``key`` (stable across processes and restarts)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % count


def socket_path(directory: Path, prefix: str, slot: int) -> Path:
    return directory / f"{prefix}-{slot}.sock"


@dataclass(slots=True)
class Answers:
    """Every sibling's answer to one question, by slot: those ``answered``, those
    ``not_running`` (no socket: restarting), the ``silent`` ones with why."""

    answered: dict[int, Message] = field(default_factory=dict)
    not_running: list[int] = field(default_factory=list)
    silent: dict[int, str] = field(default_factory=dict)


class _Quiet:
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


class _End(asyncio.Protocol):
    """A connection of the channel, either end: lines in, complaints logged once."""

    transport: asyncio.Transport

    def __init__(self, channel: Channel, limit: int) -> None:
        self._channel = channel
        self._lines = Lines(limit)
        self._complaints = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (idempotent: see _Peer._open) uvloop's transports are not asyncio.Transport's
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


class _Asking(_End):
    """This process's connection to a sibling's socket: its questions, by number, waiting for
    their answers (in any order)."""

    def __init__(self, channel: Channel, peer: _Peer) -> None:
        super().__init__(channel, channel.bounds.answer)
        self._peer = peer
        self.pending: dict[int, asyncio.Future[_Reply]] = {}
        self._quiet = _Quiet(channel.idle, self._idle)

    def send(self, n: int | None, line: bytes) -> asyncio.Future[_Reply]:
        """Write a question (``n``) or a notice (None: answered at once, with ``{}``)."""
        answer: asyncio.Future[_Reply] = self._channel.loop.create_future()
        transport = self.transport
        if transport.is_closing():
            answer.set_result(_ENDED)
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
            self._quiet = _Quiet(self._channel.idle, self._idle)
        else:
            self._peer.ended(self)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._quiet.stop()
        self._peer.ended(self)
        for answer in self.pending.values():
            if not answer.done():
                answer.set_result(_ENDED)
        self.pending.clear()


class _Peer:
    """The connection to one sibling, opened when first asked (by one question while the others
    wait for it)."""

    def __init__(self, channel: Channel, path: Path) -> None:
        self._channel = channel
        self.path = path
        self._connection: _Asking | None = None
        self._opening = asyncio.Lock()

    def send(self, n: int | None, line: bytes) -> asyncio.Future[_Reply]:
        """The answer to come. No task while a connection is open."""
        connection = self._connection
        if connection is None:
            return asyncio.ensure_future(self._opened_send(n, line))
        return connection.send(n, line)

    async def _opened_send(self, n: int | None, line: bytes) -> _Reply:
        """Raises SiblingNotRunning, or SiblingUnreachable when it cannot connect otherwise."""
        async with self._opening:
            connection = self._connection
            if connection is None:
                try:
                    transport, connection = await self._channel.loop.create_unix_connection(
                        lambda: _Asking(self._channel, self), str(self.path)
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

    def ended(self, connection: _Asking) -> None:
        if self._connection is connection:
            self._connection = None

    def close(self) -> None:
        if self._connection is not None:
            _end(self._connection.transport)


class _Answering(_End):
    """A sibling's connection to this process's socket: each question answered (inline, or from
    a task once ready); read no more while its answers are left unread; closed when silent."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel, channel.bounds.question)
        self._owed = 0  # answers being made by tasks
        self._paused = False  # its answers are left unread
        self._waiting: list[bytes | None] = []  # lines read before it was paused
        self._quiet = _Quiet(channel.silence, self._silent)

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
            self._quiet = _Quiet(self._channel.silence, self._silent)
            return
        silence = self._channel.silence
        log_event(self._channel.log, "sibling_connection_silent", logging.WARNING, after=silence)
        _end(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._quiet.stop()
        self._channel.serving.discard(self)


class Channel:
    """This process's end of the channel: its socket, its handlers, a peer per sibling.

    ``wait``: a question's deadline when none is given (and the connections' clocks: 2 waits
    idle, 5 silent); ``log``: where its warnings go (each side's own logger)."""

    def __init__(
        self,
        directory: Path,
        prefix: str,
        slot: int,
        count: int,
        *,
        wait: float,
        log: logging.Logger,
        bounds: Bounds = BOUNDS,
    ) -> None:
        self.slot, self.count = slot, count
        self.wait, self.idle, self.silence = wait, 2 * wait, 5 * wait
        self.bounds = bounds
        self.log = log
        self._path = socket_path(directory, prefix, slot)
        self._peers = {
            i: _Peer(self, socket_path(directory, prefix, i)) for i in range(count) if i != slot
        }
        self.handlers: dict[str, Handler] = {}
        self.awaited: dict[str, AwaitedHandler] = {}
        self.serving: set[_Answering] = set()  # the siblings' connections to this one
        self._numbers = itertools.count()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @property
    def siblings(self) -> Iterable[int]:
        return self._peers.keys()

    def home(self, key: str) -> int:
        return home_of(key, self.count)

    def on(self, op: str, handler: Handler) -> None:
        """Answer ``op`` inline with ``handler`` (a ``ValueError``, ``KeyError`` or
        ``TypeError`` it raises is answered ``{"error": "malformed"}``)."""
        self.handlers[op] = handler

    def on_awaited(self, op: str, handler: AwaitedHandler) -> None:
        """Answer ``op`` from a task running ``handler`` (its errors as :meth:`on`'s)."""
        self.awaited[op] = handler

    async def listen(self) -> None:
        self._path.unlink(missing_ok=True)  # a previous life's
        self._server = await self.loop.create_unix_server(lambda: _Answering(self), str(self._path))

    async def close(self) -> None:
        """Stop listening, end every connection and every task. Idempotent."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.serving):
            _end(connection.transport)
        for peer in self._peers.values():
            peer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run ``work`` in a task this channel cancels when it closes."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _question(self, op: str, fields: Message | None) -> tuple[int, bytes]:
        """A fresh number and the question's line. Raises MessageTooLarge."""
        n = next(self._numbers)
        return n, encode({"n": n, "op": op, **(fields or {})}, self.bounds.question)

    async def ask(
        self, slot: int, op: str, fields: Message | None = None, wait: float | None = None
    ) -> Message:
        """Sibling ``slot``'s answer within ``wait`` seconds (the channel's by default). Raises
        SiblingNotRunning, or SiblingUnreachable (no answer in time, a question too large)."""
        try:
            n, line = self._question(op, fields)
        except MessageTooLarge as exc:
            raise SiblingUnreachable(str(exc)) from exc
        peer, within = self._peers[slot], self.wait if wait is None else wait
        answer: asyncio.Future[_Reply] | None = None
        try:
            async with asyncio.timeout(within):
                for _ in range(2):  # once more if the connection ended (the sibling restarted)
                    answer = peer.send(n, line)
                    reply = await answer
                    if isinstance(reply, dict):
                        return reply
                    if reply != _ENDED:
                        break
        except TimeoutError:
            reply = f"no answer within {within:g} s"
        finally:
            peer.forget(n)
            _settle(answer)
        raise SiblingUnreachable(f"{peer.path.name}: {reply}")

    async def ask_all(
        self, op: str, fields: Message | None = None, wait: float | None = None
    ) -> Answers:
        """Every sibling's answer, asked at once, all within ``wait`` seconds; a silent one is
        logged (a warning)."""
        answers, peers = Answers(), self._peers
        try:
            n, line = self._question(op, fields)
        except MessageTooLarge as exc:
            answers.silent = dict.fromkeys(peers, str(exc))
            return answers
        asked = {slot: peer.send(n, line) for slot, peer in peers.items()}
        within = self.wait if wait is None else wait
        try:
            async with asyncio.timeout(within):
                for slot, answer in asked.items():
                    await self._collect(answers, slot, answer, n, line)
        except TimeoutError:
            _late(answers, asked, f"no answer within {within:g} s")
        finally:
            for slot, answer in asked.items():
                peers[slot].forget(n)
                _settle(answer)
        for slot, why in answers.silent.items():
            log_event(self.log, "sibling_silent", logging.WARNING, sibling=slot, op=op, error=why)
        return answers

    async def _collect(
        self, answers: Answers, slot: int, answer: asyncio.Future[_Reply], n: int, line: bytes
    ) -> None:
        """``answer`` (asked once more if its connection ended) into ``answers``."""
        try:
            reply = await answer
            if reply == _ENDED:
                retry = self._peers[slot].send(n, line)
                try:
                    reply = await retry
                finally:
                    _settle(retry)
        except SiblingNotRunning:
            answers.not_running.append(slot)
            return
        except SiblingUnreachable as exc:
            reply = str(exc)
        if isinstance(reply, dict):
            answers.answered[slot] = reply
        else:
            answers.silent[slot] = reply

    def tell(self, slot: int, op: str, fields: Message | None = None) -> None:
        """A notice to sibling ``slot`` (best effort: never awaited, nothing answers it; a
        notice too large is logged and dropped)."""
        try:
            line = encode({"op": op, **(fields or {})}, self.bounds.question)
        except MessageTooLarge as exc:
            log_event(self.log, "sibling_notice_too_large", logging.WARNING, error=str(exc))
            return
        sent = self._peers[slot].send(None, line)
        if not sent.done():
            self.spawn(_quietly(sent, self.wait))

    def tell_all(self, op: str, fields: Message | None = None) -> None:
        for slot in self._peers:
            self.tell(slot, op, fields)


def _end(transport: asyncio.Transport) -> None:
    """Close a connection: at once when what it has to write waits unread (a close would wait
    for the other side to read it, and uvloop's loop would not close meanwhile)."""
    if transport.get_write_buffer_size():
        transport.abort()
    else:
        transport.close()


def _late(answers: Answers, asked: dict[int, asyncio.Future[_Reply]], why: str) -> None:
    """Past the deadline: the answers that came meanwhile, the others silent for ``why``."""
    for slot, answer in asked.items():
        if slot in answers.answered or slot in answers.not_running or slot in answers.silent:
            continue
        done = answer.done() and not answer.cancelled() and answer.exception() is None
        reply = answer.result() if done else None
        if isinstance(reply, dict):
            answers.answered[slot] = reply
        else:
            answers.silent[slot] = why


def _settle(answer: asyncio.Future[_Reply] | None) -> None:
    """Cancel an answer still awaited, or mark one that failed as seen (asyncio logs an
    exception never retrieved)."""
    if answer is None:
        return
    if not answer.done():
        answer.cancel()
    elif not answer.cancelled():
        answer.exception()


async def _quietly(sent: asyncio.Future[_Reply], wait: float) -> None:
    """A notice on its way (a connection opening), given up after ``wait`` seconds."""
    try:
        async with asyncio.timeout(wait):
            await sent
    except (SiblingUnreachable, TimeoutError):
        pass
    finally:
        _settle(sent)
