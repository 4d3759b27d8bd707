"""With ``--workers``: what one worker asks the others about ids (issues 49, 59).

A call lives in the worker that accepted its connection; a cancel by id is a call of its own,
accepted by whichever worker is least loaded, and a client's own id must be free in every worker
before a call goes upstream under it. So each worker serves a Unix socket in its supervisor's
private directory (``cancel-<slot>.sock``) and asks the others over theirs
(:meth:`Siblings.ask`): one connection per question, one JSON line each way, every sibling at
once, each within ``wait`` seconds. A sibling whose socket is missing or refuses is restarting:
it holds nothing (what it held died with it), answer :data:`NOT_RUNNING`.

- ``{"op": "cancel", "id"}``: end what you hold under the id, as your own cancel API would;
  answer ``{"state": "cancelled" | "finished" | "not_held"}``.
- ``{"op": "held", "id"}``: is a call held under the id (or under an id it extends with ``:``)?
  ``{"state": "held" | "free"}``: a trusted id's call asks before it goes upstream.
- ``{"op": "bury", "id"}``: nobody held it: keep a tombstone (the call may arrive at any
  worker); ``{"state": "buried"}`` once kept: the cancel is answered after every worker's.
- ``{"op": "unbury", "id"}``: a call arrived under the id elsewhere and spent its tombstone.

Each side reads one line of at most 64 KiB within ``wait`` seconds: a JSON object whose fields
are strings (:func:`read_message`, linear in the line); anything else (another shape, nesting,
a silent or overlong connection) closes that connection alone, logged as a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from proxy.calls.held import HeldCalls

log = logging.getLogger("hangup.proxy.siblings")

COUNT_ENV = "HANGUP_PROXY_WORKERS"  # in a worker's environment: how many workers there are
LINE_LIMIT = 64 * 1024
NOT_RUNNING = "not_running"  # what a worker that is not there (restarting) answers, in effect
OPS = frozenset({"cancel", "held", "bury", "unbury"})

Answerer = Callable[[str, str], Awaitable[str]]
"""``(op, id) -> state``: what this worker answers a sibling."""


def socket_path(directory: Path, slot: int) -> Path:
    return directory / f"cancel-{slot}.sock"


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


class Siblings:
    """This worker's socket, and its questions to the other workers (the module docstring)."""

    def __init__(
        self, directory: Path, slot: int, count: int, answer: Answerer, wait: float = 2.0
    ) -> None:
        self._directory = directory
        self._slot = slot
        self._others = [s for s in range(count) if s != slot]
        self._answer = answer
        self._wait = wait
        self._server: asyncio.Server | None = None
        self._telling: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        path = socket_path(self._directory, self._slot)
        path.unlink(missing_ok=True)  # a previous life's
        self._server = await asyncio.start_unix_server(self._serve, path, limit=LINE_LIMIT)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._telling):
            task.cancel()
        await asyncio.gather(*self._telling, return_exceptions=True)

    async def ask(self, op: str, request_id: str) -> list[str | None]:
        """Every other worker's answer to ``op`` on ``request_id``: its state, ``NOT_RUNNING``
        for one that is not there, None for one that did not answer in time (or garbled)."""
        return list(await asyncio.gather(*(self._ask(s, op, request_id) for s in self._others)))

    def tell(self, op: str, request_id: str) -> None:
        """``op`` to every other worker, answers not awaited (a task that outlives the caller)."""
        task = asyncio.get_running_loop().create_task(self.ask(op, request_id))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _ask(self, slot: int, op: str, request_id: str) -> str | None:
        path = socket_path(self._directory, slot)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self._wait):
                try:
                    reader, writer = await asyncio.open_unix_connection(path, limit=LINE_LIMIT)
                except (FileNotFoundError, ConnectionRefusedError):
                    return NOT_RUNNING
                writer.write(json.dumps({"op": op, "id": request_id}).encode() + b"\n")
                return read_message(await reader.readline(), "state")["state"]
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning(
                "worker %d did not answer %s: %s", slot, op, exc or type(exc).__name__,
                extra={"fields": {"request_id": request_id[:200]}},
            )  # fmt: skip
            return None
        finally:
            if writer is not None:
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._wait):
                message = read_message(await reader.readline(), "op", "id")
            op, request_id = message["op"], message["id"]
            if op not in OPS or request_id is None:
                raise ValueError(f"no such question: {op!r}")
            state = await self._answer(op, request_id)
            writer.write(json.dumps({"state": state}).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            log.warning(
                "a sibling's question was refused: %s", exc or type(exc).__name__,
                extra={"fields": {"worker": self._slot}},
            )  # fmt: skip
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def answerer(held: HeldCalls) -> Answerer:
    """What a worker holding ``held`` answers its siblings."""

    async def answer(op: str, request_id: str) -> str:
        if op == "cancel":
            return await held.cancel(request_id) or "not_held"
        if op == "held":
            return "held" if held.holds(request_id) else "free"
        if op == "bury":
            held.bury(request_id)
            return "buried"
        held.unbury(request_id)
        return "unburied"

    return answer
