"""With ``--workers``: a cancel by id reaches the worker that holds the call (issue 49).

A call lives in the worker that accepted its connection; a cancel by id is a call of its own,
accepted by whichever worker is least loaded. So each worker serves a Unix socket in its
supervisor's private directory (``cancel-<slot>.sock``), and the worker a cancel lands on asks
the others when it holds nothing under the id (:meth:`Siblings.ask`): one connection per
question, one JSON line each way, every sibling at once, each within ``wait`` seconds (a
sibling that is restarting counts as holding nothing: what it held died with it).

- ``{"op": "cancel", "id"}``: end what you hold under the id, as your own cancel API would;
  answer ``{"state": "cancelled" | "finished" | "not_held"}``.
- ``{"op": "bury", "id"}``: nobody held it: keep a tombstone (the call may arrive at any worker).
- ``{"op": "unbury", "id"}``: a call arrived under the id elsewhere and spent its tombstone.

Cancels by id are rare next to calls: nothing is asked of a sibling on a call's way through.
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
_LINE_LIMIT = 64 * 1024

Answerer = Callable[[str, str], Awaitable[str | None]]
"""``(op, id) -> state``: what this worker answers a sibling (None for a notice)."""


def socket_path(directory: Path, slot: int) -> Path:
    return directory / f"cancel-{slot}.sock"


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
        self._server = await asyncio.start_unix_server(self._serve, path, limit=_LINE_LIMIT)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._telling):
            task.cancel()
        await asyncio.gather(*self._telling, return_exceptions=True)

    async def ask(self, op: str, request_id: str) -> list[str]:
        """Every other worker's answer to ``op`` on ``request_id`` (none from one that did not
        answer in time)."""
        answers = await asyncio.gather(*(self._ask(s, op, request_id) for s in self._others))
        return [a for a in answers if a is not None]

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
                reader, writer = await asyncio.open_unix_connection(path, limit=_LINE_LIMIT)
                writer.write(json.dumps({"op": op, "id": request_id}).encode() + b"\n")
                answer = json.loads(await reader.readline())
            state = answer.get("state") if isinstance(answer, dict) else None
            return state if isinstance(state, str) else None
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning(
                "worker %d did not answer %s: %s", slot, op, exc or type(exc).__name__,
                extra={"fields": {"request_id": request_id}},
            )  # fmt: skip
            return None
        finally:
            if writer is not None:
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ValueError, asyncio.IncompleteReadError):
            message = json.loads(await reader.readline())
            op, request_id = message.get("op"), message.get("id")
            state = None
            if isinstance(op, str) and isinstance(request_id, str):
                state = await self._answer(op, request_id)
            writer.write(json.dumps({"state": state}).encode() + b"\n")
            await writer.drain()
        writer.close()


def answerer(held: HeldCalls) -> Answerer:
    """What a worker holding ``held`` answers its siblings."""

    async def answer(op: str, request_id: str) -> str | None:
        if op == "cancel":
            return await held.cancel(request_id) or "not_held"
        if op == "bury":
            held.bury(request_id)
        elif op == "unbury":
            held.unbury(request_id)
        return None

    return answer
