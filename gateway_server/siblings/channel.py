"""The channel between the API processes of one gateway: JSON lines over Unix sockets.

Each process listens on ``api-<slot>.sock`` in the gateway's private run directory and keeps
one connection to each sibling, opened on first use. A question (:meth:`Channel.ask`) carries
``"n"``, a sequence number its answer repeats; a notice (:meth:`Channel.tell`) carries none and
gets no answer. Every question has a deadline: a sibling that does not answer by then, or whose
socket is gone, is :class:`SiblingUnreachable`.

What a process answers is a table from :class:`Op` to a handler of the message (its users
register theirs). A handler that awaits (a cancel waits for its engines' abort) answers from a
task of its own, so the connection goes on reading; the others answer inline, in order.

One bad message never breaks the channel: a line longer than :data:`LINE_LIMIT` is skipped to
its end, and one that is no message (not JSON, no known ``op``, a field missing or of the wrong
kind) is answered with ``{"error": "malformed"}`` when it carries a sequence number; either way
it is logged and the connection reads on, so the questions of every other call on it are
answered. A question or answer too large to send is never written: the question fails as
unreachable, the answer becomes an error. (Every id in a message is held to the id or cancel
rule before it gets here, so none is large.)
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeGuard

from gateway_server.siblings.processes import ApiProcess
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")

LINE_LIMIT = 64 * 1024 * 1024  # a /v2/requests answer of a busy process is one line
ASK_WAIT = 5.0  # seconds a sibling has to answer a claim, a listing or its gauges

Message = dict[str, Any]
Handler = Callable[[Message], Message | None]
"""Answers a message inline (None: a notice, nothing to answer)."""
AwaitedHandler = Callable[[Message], Awaitable[Message]]
"""Answers a message from a task of its own."""


class Op(enum.StrEnum):
    """What one API process asks or tells another (the message's ``op``)."""

    HELLO = "hello"
    """A process (re)started: forget what its previous life ran; send the ids it is home of."""
    CLAIM = "claim"
    """To an id's home: this process runs the id (refused for a duplicate or a tombstone)."""
    RELEASE = "release"
    """To an id's home, no answer: the id ended here after so many tokens."""
    CANCEL = "cancel"
    """To an id's home: cancel it wherever it runs."""
    CANCEL_OWNED = "cancel_owned"
    """To the process running an id (or every process, the home being unreachable)."""
    CANCEL_GROUP = "cancel_group"
    """To every process: cancel the calls of a group you run, refuse its calls for a while."""
    CALLS = "calls"
    """The calls in flight (``GET /v2/requests``)."""
    LOADS = "loads"
    """The engine workers' loads (``/metrics/pool``)."""
    GAUGES = "gauges"
    """The live gauges and the workers' loads (``/metrics``)."""
    CANCEL_RESPONSE = "cancel_response"
    """To a response id's home (the process that made it and holds its record): cancel it."""
    RESPONSE = "response"
    """To a response id's home: the stored response's object (``GET``)."""
    DELETE_RESPONSE = "delete_response"
    """To a response id's home: forget the stored response (``DELETE``)."""
    RESPONSE_TURNS = "response_turns"
    """To a response id's home: the turns a ``previous_response_id`` naming it continues."""
    RESPONSE_EVENTS = "response_events"
    """To a response id's home: a page of a background response's events after a number."""


class SiblingUnreachable(Exception):
    """A sibling did not answer (not running, restarting, or past the deadline)."""


def socket_path(run_dir: Path, slot: int) -> Path:
    return run_dir / f"api-{slot}.sock"


class Channel:
    """This process's end of the channel: its listener, its handlers, a peer per sibling."""

    def __init__(self, me: ApiProcess) -> None:
        self.slot = me.slot
        self.count = me.count
        self._path = socket_path(me.run_dir, me.slot)
        self._peers = {
            i: _Peer(socket_path(me.run_dir, i)) for i in range(me.count) if i != me.slot
        }
        self._handlers: dict[Op, Handler] = {}
        self._awaited: dict[Op, AwaitedHandler] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The siblings' connections to this process, each read by a task of the server's.
        self._serving: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    def on(self, op: Op, handler: Handler) -> None:
        """Answer ``op`` inline with ``handler``."""
        self._handlers[op] = handler

    def on_awaited(self, op: Op, handler: AwaitedHandler) -> None:
        """Answer ``op`` from a task running ``handler``."""
        self._awaited[op] = handler

    async def listen(self) -> None:
        self._path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, self._path, limit=LINE_LIMIT)

    async def close(self) -> None:
        """Stop listening and end every connection. The siblings' connections are closed, so
        that their reading tasks end by themselves: one still running when the loop stops would
        be cancelled, and Python 3.11's streams log a cancelled handler as an unhandled
        exception (a traceback in a log of JSON lines)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in self._serving.values():
            writer.close()
        await asyncio.gather(*self._serving, return_exceptions=True)
        await asyncio.gather(*(p.close() for p in self._peers.values()), return_exceptions=True)

    async def ask(self, slot: int, op: Op, fields: Message, wait: float = ASK_WAIT) -> Message:
        """Sibling ``slot``'s answer. Raises SiblingUnreachable."""
        return await self._peers[slot].ask({"op": op.value, **fields}, wait)

    def tell(self, slot: int, op: Op, fields: Message) -> None:
        """Send without waiting for an answer (best effort: dropped when not connected)."""
        self._peers[slot].tell({"op": op.value, **fields})

    async def ask_all(
        self, op: Op, fields: Message | None = None, wait: float = ASK_WAIT
    ) -> list[tuple[int, Message]]:
        """Every reachable sibling's answer, with its slot."""
        slots = list(self._peers)
        message = {"op": op.value, **(fields or {})}
        answers = await asyncio.gather(
            *(self._peers[s].ask(message, wait) for s in slots), return_exceptions=True
        )
        return [(s, a) for s, a in zip(slots, answers, strict=True) if isinstance(a, dict)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._serving[me] = writer
        try:
            async for message in _messages(reader):
                self._answer(message, writer)
        except OSError as exc:
            log_event(log, "sibling_channel_error", logging.WARNING, error=repr(exc))
        finally:
            del self._serving[me]
            writer.close()

    def _answer(self, message: Message, writer: asyncio.StreamWriter) -> None:
        """Answer one message (inline, or from a task); a malformed one is answered with an
        error, when it can be, and logged: the connection goes on."""
        seq = message.get("n")
        try:
            op = Op(message["op"])
            awaited = self._awaited.get(op)
            if awaited is not None:
                _check_seq(seq)
                task = asyncio.get_running_loop().create_task(
                    _answer_later(awaited, message, writer)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            reply = self._handlers[op](message)
        except (ValueError, KeyError, TypeError) as exc:
            _malformed(exc)
            reply = {"error": "malformed"}
        if reply is None:
            return
        if _is_seq(seq):
            _write_answer(writer, reply, seq)
        else:
            _malformed(ValueError("a question without a sequence number"))


def _is_seq(seq: object) -> TypeGuard[int]:
    return isinstance(seq, int) and not isinstance(seq, bool)


def _check_seq(seq: object) -> None:
    if not _is_seq(seq):
        raise ValueError("a question without a sequence number")


def _malformed(exc: BaseException) -> None:
    log_event(log, "sibling_message_malformed", logging.WARNING, error=repr(exc)[:200])


def _write_answer(writer: asyncio.StreamWriter, reply: Message, seq: int) -> None:
    if writer.is_closing():
        return
    try:
        writer.write(_line({**reply, "n": seq}))
    except MessageTooLarge as exc:
        log_event(log, "sibling_answer_too_large", logging.WARNING, error=str(exc))
        writer.write(_line({"error": "answer too large", "n": seq}))


async def _answer_later(
    handler: AwaitedHandler, message: Message, writer: asyncio.StreamWriter
) -> None:
    try:
        reply = await handler(message)
    except (ValueError, KeyError, TypeError) as exc:
        _malformed(exc)
        reply = {"error": "malformed"}
    _write_answer(writer, reply, message["n"])


async def _messages(reader: asyncio.StreamReader) -> AsyncIterator[Message]:
    """Each JSON object sent on ``reader``, one a line, until the end. A line over the limit is
    skipped to its end (the reader's buffer never holds more than the limit), one that is no
    JSON object is skipped; both are logged."""
    skipping = False
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            return  # the end (a last line without its newline is no message)
        except asyncio.LimitOverrunError as exc:
            await reader.readexactly(exc.consumed)  # drop what is buffered of the long line
            if not skipping:
                log_event(log, "sibling_line_too_long", logging.WARNING, limit=LINE_LIMIT)
            skipping = True
            continue
        if skipping:  # the end of the long line
            skipping = False
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            _malformed(exc)
            continue
        if isinstance(message, dict):
            yield message
        else:
            _malformed(TypeError(f"a message must be a JSON object, not {type(message).__name__}"))


class _Peer:
    """The connection to one sibling: questions out, answers matched by sequence number."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._seq = 0
        self._connecting = asyncio.Lock()
        self._reading: asyncio.Task[None] | None = None

    async def ask(self, message: Message, wait: float) -> Message:
        try:
            async with asyncio.timeout(wait):
                writer = self._writer
                if writer is None or writer.is_closing():
                    writer = await self._connect()
                self._seq += 1
                seq = self._seq
                answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
                line = _line({**message, "n": seq})
                self._pending[seq] = answer
                writer.write(line)
                try:
                    return await answer
                finally:
                    self._pending.pop(seq, None)
        except (OSError, TimeoutError, MessageTooLarge) as exc:
            raise SiblingUnreachable(f"{self._path.name}: {exc or type(exc).__name__}") from exc

    def tell(self, message: Message) -> None:
        try:
            line = _line(message)
        except MessageTooLarge as exc:
            log_event(log, "sibling_notice_too_large", logging.WARNING, error=str(exc))
            return
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.write(line)
        else:
            asyncio.get_running_loop().create_task(self._tell_later(line))

    async def _tell_later(self, line: bytes) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            writer = await asyncio.wait_for(self._connect(), ASK_WAIT)
            writer.write(line)

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                reader, writer = await asyncio.open_unix_connection(self._path, limit=LINE_LIMIT)
                self._writer = writer
                self._reading = asyncio.get_running_loop().create_task(self._read(reader))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            async for message in _messages(reader):
                seq = message.get("n", -1)
                answer = self._pending.get(seq) if isinstance(seq, int) else None
                if answer is not None and not answer.done():
                    answer.set_result(message)
        except OSError:
            pass
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(ConnectionResetError("sibling closed the connection"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)


class MessageTooLarge(ValueError):
    """A message whose line would pass :data:`LINE_LIMIT`: never written."""


def _line(message: Message) -> bytes:
    """``message`` as one line. Raises MessageTooLarge past the limit (the other side would
    skip it: better it is never sent)."""
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if len(line) > LINE_LIMIT:
        raise MessageTooLarge(f"a {message.get('op', 'answer')} message of {len(line):,} bytes")
    return line
