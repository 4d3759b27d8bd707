"""With ``--workers``: what one worker asks the others about ids (issues 49, 59).

A call lives in the worker that accepted its connection; a cancel by id is a call of its own,
accepted by whichever worker is least loaded, and a client's own id must be free in every worker
before a call goes upstream under it. So each worker serves a Unix socket in its supervisor's
private directory (``cancel-<slot>.sock``) and asks the others over theirs
(:meth:`Siblings.ask`): every sibling at once, each within ``wait`` seconds, over one connection
to each, kept while questions come, a JSON line each way, numbered (``"n"``, a string) so that
answers may come in any order. A trusted id's call asks on its way, so both ends are protocol
callbacks (no task, no stream reader): a connection per question cost three times a short
call's own CPU. A sibling whose socket is missing or refuses is restarting: it holds nothing
(what it held died with it), answer :data:`NOT_RUNNING`.

- ``{"n", "op": "cancel", "id"}``: end what you hold under the id, as your own cancel API would;
  answer ``{"n", "state": "cancelled" | "finished" | "not_held"}``.
- ``"held"``: is a call held under the id (or under an id it extends with ``:``)? ``"held"`` or
  ``"free"``: a trusted id's call asks before it goes upstream.
- ``"bury"``: nobody held it: keep a tombstone (the call may arrive at any worker); ``"buried"``
  once kept: the cancel is answered after every worker's.
- ``"unbury"``: a call arrived under the id elsewhere and spent its tombstone; ``"unburied"``.
- ``"cancel_group"`` (the ``id`` is a group): end every call of the group you hold, refuse its
  calls for the ttl; the ``state`` is a JSON object, ``{"entries": [{"request_id", "state",
  "client_request_id"?}, ...], "more": N}``: the entries that fit in a line, and how many did
  not (:func:`fitted`).
- ``"list"`` (the ``id`` is a group, or empty for every call): the calls you hold, as the
  sidecar's list shows them (``ServerState.listing``), in the same JSON object.

Each line is at most 64 KiB, a JSON object whose fields are strings (:func:`read_message`,
linear in the line). The asker closes a connection after 2 waits without a question, the
server one silent for 5 waits; anything else (another shape, nesting, an overlong line,
answers left unread) closes that connection alone, logged as a warning.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

from proxy.calls.held import Call, HeldCalls

log = logging.getLogger("hangup.proxy.siblings")

COUNT_ENV = "HANGUP_PROXY_WORKERS"  # in a worker's environment: how many workers there are
LINE_LIMIT = 64 * 1024
NOT_RUNNING = "not_running"  # what a worker that is not there (restarting) answers, in effect
_ENDED = "(ended)"  # a question's answer when its connection ended before the answer came
_NOW = frozenset({"held", "bury", "unbury", "list"})  # answered at once
_AWAITED = frozenset({"cancel", "cancel_group"})  # answered once the upstream answered
_FIT = LINE_LIMIT - 4096  # what a fitted answer's line may take (the rest: "n" and framing)


def socket_path(directory: Path, slot: int) -> Path:
    return directory / f"cancel-{slot}.sock"


def fitted(entries: list[dict[str, object]]) -> str:
    """``entries`` as one answer's ``state``: ``{"entries": [...], "more": N}``, as many as fit
    in a line (the first ones), ``more`` counting the rest."""
    kept = len(entries)
    while True:
        state = json.dumps({"entries": entries[:kept], "more": len(entries) - kept})
        if len(json.dumps(state)) <= _FIT or kept == 0:
            return state
        kept = kept * 3 // 4


def unfitted(state: str | None) -> tuple[list[dict[str, object]], int]:
    """A fitted answer's entries and how many more there were (none for a state that is no
    such answer: a worker not running, or not answering)."""
    try:
        answer = json.loads(state or "")
    except (ValueError, RecursionError):
        return [], 0
    if not isinstance(answer, dict) or not isinstance(answer.get("entries"), list):
        return [], 0
    more = answer.get("more")
    entries = [e for e in answer["entries"] if isinstance(e, dict)]
    return entries, more if isinstance(more, int) else 0


def read_message(line: bytes, *fields: str) -> dict[str, str | None]:
    """``fields`` of one line of the channel: a JSON object, each of ``fields`` a string or
    absent (None). Raises ``ValueError`` naming what is wrong for anything else: over
    ``LINE_LIMIT`` bytes, not JSON, not an object, a field of another type, nesting deeper than
    the JSON parser goes. Linear in the line (Python's JSON parser)."""
    if len(line) > LINE_LIMIT:
        raise ValueError(f"a line over {LINE_LIMIT} bytes")
    try:
        message: Any = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("nested too deep") from exc
    if not isinstance(message, dict):
        raise ValueError(f"not a JSON object: {type(message).__name__}")
    values: dict[str, str | None] = {}
    for name in fields:
        value = message.get(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name!r} is not a string")
        values[name] = value
    return values


class _Lines:
    """Whole lines out of bytes as they come, each byte looked at once; ``ValueError`` once the
    line being read is over ``LINE_LIMIT``."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # of the buffer: no newline there

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        lines, start, at = [], 0, self._scanned
        while (end := buffer.find(b"\n", at)) >= 0:
            lines.append(bytes(buffer[start:end]))
            start = at = end + 1
        del buffer[:start]
        self._scanned = len(buffer)
        if len(buffer) > LINE_LIMIT:
            raise ValueError(f"a line over {LINE_LIMIT} bytes")
        return lines


class _Line(asyncio.Protocol):
    """A connection that reads lines (what both ends share)."""

    transport: asyncio.Transport

    def __init__(self) -> None:
        self._lines = _Lines()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (idempotent: see _Peer._open) uvloop's transports are not asyncio.Transport's
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            for line in self._lines.feed(data):
                self.line(line)
        except ValueError as exc:
            self.refuse(str(exc))

    def line(self, line: bytes) -> None:
        raise NotImplementedError

    def refuse(self, why: str) -> None:
        log.warning("closed a worker's connection: %s", why)
        self.transport.close()

    def send(self, message: dict[str, str | None]) -> None:
        if not self.transport.is_closing():
            self.transport.write(json.dumps(message).encode() + b"\n")


class _Quiet:
    """Calls ``then`` once ``touch`` was not called for ``after`` seconds: one timer, moved
    only when it fires (a message costs a clock read, not a timer)."""

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


class _Asking(_Line):
    """This worker's connection to another's socket: its questions, numbered, waiting for their
    answers (in any order); closed by this side after ``idle`` seconds without a question."""

    def __init__(self, peer: _Peer, idle: float) -> None:
        super().__init__()
        self._peer = peer
        self._numbers = itertools.count()
        self.pending: dict[str, asyncio.Future[str | None]] = {}
        self._idle_after = idle
        self._quiet = _Quiet(idle, self._idle)

    def ask(self, op: str, request_id: str) -> asyncio.Future[str | None]:
        number = str(next(self._numbers))
        answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.pending[number] = answer
        answer.add_done_callback(lambda _: self.pending.pop(number, None))
        self.send({"n": number, "op": op, "id": request_id})
        self._quiet.touch()
        return answer

    def line(self, line: bytes) -> None:
        message = read_message(line, "n", "state")
        answer = self.pending.get(message["n"] or "")
        if answer is not None and not answer.done():
            answer.set_result(message["state"])

    def _idle(self) -> None:
        if self.pending:
            self._quiet = _Quiet(self._idle_after, self._idle)
        else:
            self._peer.ended(self)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._quiet.stop()
        self._peer.ended(self)
        for answer in list(self.pending.values()):
            if not answer.done():
                answer.set_result(_ENDED)


class _Peer:
    """The connection to one other worker, opened when first asked (by one question while the
    others wait for it)."""

    def __init__(self, path: Path, idle: float) -> None:
        self._path = path
        self._idle = idle
        self._connection: _Asking | None = None
        self._opening = asyncio.Lock()

    def question(self, op: str, request_id: str) -> asyncio.Future[str | None]:
        """The peer's answer to come: its state, ``NOT_RUNNING`` when it is not there,
        ``_ENDED`` when the connection ended first. No task while a connection is open."""
        connection = self._connection
        if connection is None:
            return asyncio.ensure_future(self._opened_question(op, request_id))
        return connection.ask(op, request_id)

    async def _opened_question(self, op: str, request_id: str) -> str | None:
        """Raises ``OSError`` when it cannot connect (but for a peer that is not there)."""
        async with self._opening:
            if self._connection is None:
                loop = asyncio.get_running_loop()
                try:
                    transport, connection = await loop.create_unix_connection(
                        lambda: _Asking(self, self._idle), str(self._path)
                    )
                except (FileNotFoundError, ConnectionRefusedError):
                    return NOT_RUNNING  # restarting, or gone
                connection.connection_made(transport)  # uvloop may call it only after this
                self._connection = connection
            connection = self._connection
        return await connection.ask(op, request_id)

    def ended(self, connection: _Asking) -> None:
        if self._connection is connection:
            self._connection = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.transport.close()


class _Answering(_Line):
    """Another worker's connection to this one's socket: each question answered as its line
    comes (a cancel once the upstream answered it); closed when silent for ``silence`` seconds
    or when its answers are not read."""

    def __init__(self, siblings: Siblings, silence: float) -> None:
        super().__init__()
        self._siblings = siblings
        self._quiet = _Quiet(silence, lambda: self.refuse(f"silent for {silence:g} s"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._siblings.serving.add(self)

    def line(self, line: bytes) -> None:
        message = read_message(line, "n", "op", "id")
        number, op, request_id = message["n"], message["op"], message["id"]
        if number is None or request_id is None or (op not in _NOW and op not in _AWAITED):
            raise ValueError(f"no such question: {op!r}")
        self._quiet.touch()
        if op == "cancel":
            self._siblings.spawn(self._cancel(number, request_id))
        elif op == "cancel_group":
            self._siblings.spawn(self._cancel_group(number, request_id))
        else:
            self.send({"n": number, "state": self._siblings.answer_now(op, request_id)})
        if self.transport.get_write_buffer_size() > LINE_LIMIT:
            raise ValueError("its answers are not read")

    async def _cancel(self, number: str, request_id: str) -> None:
        self.send(
            {"n": number, "state": await self._siblings.held.cancel(request_id) or "not_held"}
        )

    async def _cancel_group(self, number: str, group: str) -> None:
        ended = await self._siblings.held.cancel_group(group)
        self.send({"n": number, "state": fitted([group_entry(c, s) for c, s in ended])})

    def connection_lost(self, exc: Exception | None) -> None:
        self._quiet.stop()
        self._siblings.serving.discard(self)


class Siblings:
    """This worker's socket, and its questions to the other workers (the module docstring).
    ``held``: what this worker holds (what it answers)."""

    def __init__(
        self, directory: Path, slot: int, count: int, held: HeldCalls, wait: float = 2.0
    ) -> None:
        self._directory = directory
        self._slot = slot
        self.held = held
        self._wait = wait
        # A connection not used for 2 waits is closed by its asker, one silent for 5 by its
        # server (the asker first: a question never meets a connection its server is closing).
        self._peers: dict[int, _Peer] = {
            other: _Peer(socket_path(directory, other), 2 * wait)
            for other in range(count)
            if other != slot
        }
        self._server: asyncio.Server | None = None
        self.serving: set[_Answering] = set()  # the other workers' connections to this one
        self.listing: Callable[[str | None], list[dict[str, object]]] = lambda group: []
        """What this worker answers ``list`` with (``ServerState.listing``, set by the server)."""
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        path = socket_path(self._directory, self._slot)
        path.unlink(missing_ok=True)  # a previous life's
        loop = asyncio.get_running_loop()
        silence = 5 * self._wait
        self._server = await loop.create_unix_server(lambda: _Answering(self, silence), str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.serving):
            connection.transport.close()
        for peer in self._peers.values():
            peer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def ask(self, op: str, request_id: str) -> list[str | None]:
        """Every other worker's answer to ``op`` on ``request_id``: its state, ``NOT_RUNNING``
        for one that is not there, None for one that did not answer in time (or garbled). A
        question whose connection ended unanswered is asked once more (a worker that died is
        then not there)."""
        peers = list(self._peers.values())
        asked = [peer.question(op, request_id) for peer in peers]
        states: list[str | None] = [None] * len(asked)
        why = "no answer in time"
        try:
            async with asyncio.timeout(self._wait):
                for at, (peer, answer) in enumerate(zip(peers, asked, strict=True)):
                    state = await answer
                    if state == _ENDED:
                        state = await peer.question(op, request_id)
                    states[at] = None if state == _ENDED else state
        except (OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
        finally:
            for answer in asked:
                answer.cancel()  # one not answered (nothing if it was)
        for slot, state in zip(self._peers, states, strict=True):
            if state is None:
                log.warning(
                    "worker %d did not answer %s: %s", slot, op, why,
                    extra={"fields": {"request_id": request_id[:200]}},
                )  # fmt: skip
        return states

    def tell(self, op: str, request_id: str) -> None:
        """``op`` to every other worker, answers not awaited (a task that outlives the caller)."""
        self.spawn(self.ask(op, request_id))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def answer_now(self, op: str, request_id: str) -> str:
        """What this worker answers ``held``, ``bury``, ``unbury`` and ``list`` (at once)."""
        held = self.held
        if op == "list":
            return fitted(self.listing(request_id or None))
        if op == "held":
            return "held" if held.holds(request_id) else "free"
        if op == "bury":
            held.bury(request_id)
            return "buried"
        held.unbury(request_id)
        return "unburied"


def group_entry(call: Call, state: str) -> dict[str, object]:
    """A group cancel's entry for one call held here: its id upstream (echoed to its client),
    what happened to it, and the client's own id when the call is held under it too."""
    entry: dict[str, object] = {"request_id": call.request_id, "state": state}
    if call.client_request_id is not None and call.client_request_id != call.request_id:
        entry["client_request_id"] = call.client_request_id
    return entry
