"""The responses of one ``ModelStreamInfer`` stream waiting for its writer, bounded in bytes.

The stream's requests put their encoded responses here and one writer takes them out in order
and writes them to the client. A client that reads slower than the engine generates, or not at
all, would otherwise make the gateway hold every response it has not read. So :meth:`put` waits
while the responses held reach ``limit`` bytes: the request that put it waits with it, reads no
more of its engine request, and the stream's generation stops where the client stopped reading
(one response past the limit at most, so a single response larger than the limit still passes).

:meth:`close` ends the stream: the writer takes what is held, then ``None``; a response put
after that is dropped (the stream has ended; nobody will read it). No I/O and no tasks of its
own: one deque, its byte count, and two events. (A writer that has fallen behind could one day
merge the held token responses of a request instead of making it wait, as DESIGN.md's "Streams
that fall behind" allows: that is a change inside this class.)
"""

from __future__ import annotations

import asyncio
from collections import deque


class Outbox:
    __slots__ = ("_closed", "_held", "_items", "_limit", "_ready", "_room")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: deque[bytes] = deque()
        self._held = 0
        self._closed = False
        self._ready = asyncio.Event()
        """Set while there is something for the writer: a response, or the end."""
        self._room = asyncio.Event()
        """Set while a response may be put without waiting."""
        self._room.set()

    @property
    def held_bytes(self) -> int:
        return self._held

    async def put(self, response: bytes) -> None:
        """Hold ``response`` for the writer, once the bytes held are under the limit (or drop
        it, if the stream has ended meanwhile)."""
        while self._held >= self._limit and not self._closed:
            self._room.clear()
            await self._room.wait()
        if self._closed:
            return
        self._items.append(response)
        self._held += len(response)
        self._ready.set()

    def close(self) -> None:
        """The end of the stream: the writer gets what is held, then ``None``. Idempotent."""
        self._closed = True
        self._ready.set()
        self._room.set()  # a request still waiting to put drops its response and goes on

    async def get(self) -> bytes | None:
        """The next response, in the order they were put; ``None`` once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        response = self._items.popleft()
        self._held -= len(response)
        if self._held < self._limit:
            self._room.set()
        return response
