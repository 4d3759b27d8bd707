"""One sibling channel: how the processes of one server ask one another, over Unix sockets.

The proxy's workers (``--workers``) and the gateway's API processes (``--api-processes``) each
serve a socket ``<prefix>-<slot>.sock`` in their supervisor's private directory and keep one
connection to each sibling's, opened when first asked and kept while questions come. Messages
are JSON lines (:mod:`hangup_contract.runtime.sibling_lines`); each side's ops are its own
vocabulary, registered with :meth:`Channel.on` (answered inline, in order) or
:meth:`Channel.on_awaited` (answered from a task once ready: a cancel waits for its engines).
Both ends are protocol callbacks (:mod:`hangup_contract.runtime.sibling_connections`): while a
connection is open, a question costs no task and no stream reader (the proxy asks on a call's
way upstream).

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
from typing import Any

from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.sibling_connections import (
    ENDED,
    Answering,
    Peer,
    Reply,
    SiblingNotRunning,
    SiblingUnreachable,
    end_connection,
)
from hangup_contract.runtime.sibling_lines import (
    BOUNDS,
    Bounds,
    Message,
    MessageTooLarge,
    encode,
)

__all__ = [
    "Answers",
    "AwaitedHandler",
    "Channel",
    "Handler",
    "SiblingNotRunning",
    "SiblingUnreachable",
    "home_of",
    "socket_path",
]

Handler = Callable[[Message], Message]
"""Answers a message inline (a notice's answer is dropped)."""
AwaitedHandler = Callable[[Message], Awaitable[Message]]
"""Answers a message from a task of its own."""


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
            i: Peer(self, socket_path(directory, prefix, i)) for i in range(count) if i != slot
        }
        self.handlers: dict[str, Handler] = {}
        self.awaited: dict[str, AwaitedHandler] = {}
        self.serving: set[Answering] = set()  # the siblings' connections to this one
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
        self._server = await self.loop.create_unix_server(lambda: Answering(self), str(self._path))

    async def close(self) -> None:
        """Stop listening, end every connection and every task. Idempotent."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.serving):
            end_connection(connection.transport)
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
        answer: asyncio.Future[Reply] | None = None
        try:
            async with asyncio.timeout(within):
                for _ in range(2):  # once more if the connection ended (the sibling restarted)
                    answer = peer.send(n, line)
                    reply = await answer
                    if isinstance(reply, dict):
                        return reply
                    if reply != ENDED:
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
        self, answers: Answers, slot: int, answer: asyncio.Future[Reply], n: int, line: bytes
    ) -> None:
        """``answer`` (asked once more if its connection ended) into ``answers``."""
        try:
            reply = await answer
            if reply == ENDED:
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


def _late(answers: Answers, asked: dict[int, asyncio.Future[Reply]], why: str) -> None:
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


def _settle(answer: asyncio.Future[Reply] | None) -> None:
    """Cancel an answer still awaited, or mark one that failed as seen (asyncio logs an
    exception never retrieved)."""
    if answer is None:
        return
    if not answer.done():
        answer.cancel()
    elif not answer.cancelled():
        answer.exception()


async def _quietly(sent: asyncio.Future[Reply], wait: float) -> None:
    """A notice on its way (a connection opening), given up after ``wait`` seconds."""
    try:
        async with asyncio.timeout(wait):
            await sent
    except (SiblingUnreachable, TimeoutError):
        pass
    finally:
        _settle(sent)
