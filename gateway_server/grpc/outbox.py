"""The responses of one ``ModelStreamInfer`` stream waiting for its writer, bounded in bytes, a
request's tokens merged into one response while the writer is behind.

The stream's requests put their responses here and one writer takes them out in order and
writes them to the client. While the writer keeps up it is waiting in :meth:`get` when a
response is put and takes it at once: one response per token, none held back. Once it has
fallen behind (the client, or the network, slower than the engine), a token put while its
request has a text response still waiting joins that response's text instead of queueing after
it, as vLLM's output collector merges a slow consumer's outputs and Triton's vLLM backend then
sends them as one response (its ``text_output`` all the text since the previous one, flagged
final when the request finished). The merged response keeps its place (its first token's),
carries the request's parameters, and is flagged ``triton_final_response`` when its last token
is the request's last; a final response takes no more. Never merged: two requests' responses,
the empty final response (:meth:`put_text` with no text: a response of its own, after the
request's text) and error responses (:meth:`put`, written as given; no token put after one is
merged ahead of it). One response takes at most :data:`MERGED_BYTES` of text, so none outgrows
a client's receive limit whatever the buffer's size.

A client that reads slower than the engine generates, or not at all, would otherwise make the
gateway hold every response it has not read. So a put waits while the responses held reach
``limit`` bytes, counted as they will be written (a merged token adds its text's bytes; one
that starts a response, that response's own bytes too): the request that put it waits with it
and takes no more tokens from its engine request (one response past the limit at most, so a
single response larger than the limit still passes). Merged, a token costs only its text's
bytes, not a response's (model name, ids, parameters: 60 to 400 bytes), so the limit holds 10
to 50 times more tokens before a request waits.

:meth:`close` ends the stream: the writer takes what is held, then ``None``; a response put
after that is dropped (the stream has ended; nobody will read it). No I/O and no tasks of its
own: one deque, each request's open text response, their byte count, and two events.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway_server.grpc.responses import TextResponses

MERGED_BYTES = 64 * 1024
"""The most text one merged response takes (a token larger than this is a response of its own):
well under gRPC's default receive limit of 4 MiB, and a response's own bytes (60 to 400) are
nothing against it."""


class _Text:
    """One text response waiting for the writer: its request's parts, its text (the tokens put
    while it waited, in order), its flag, and the bytes it will take written, at most."""

    __slots__ = ("data", "final", "more", "responses", "size")

    def __init__(self, responses: TextResponses, data: bytes, final: bool, size: int) -> None:
        self.responses = responses
        self.data = data
        self.more: list[bytes] | None = None
        """Every part once a second token joined (the first included); None until then."""
        self.final = final
        self.size = size

    def join(self, data: bytes, final: bool) -> None:
        if self.more is None:
            self.more = [self.data]
        self.more.append(data)
        self.size += len(data)
        self.final = final

    def encode(self) -> bytes:
        data = self.data if self.more is None else b"".join(self.more)
        return self.responses.encode(data, self.final)


class Outbox:
    __slots__ = ("_closed", "_held", "_items", "_limit", "_open", "_ready", "_room")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: deque[_Text | bytes] = deque()
        self._open: dict[TextResponses, _Text] = {}
        """Each request's text response still waiting that its next token may join."""
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
        """Hold ``response`` (a serialized ``ModelStreamInferResponse``, never merged) for the
        writer, once the bytes held are under the limit (or drop it, if the stream has ended
        meanwhile). Nothing put after it is merged ahead of it, whichever request it answers
        (errors are rare: the merging starts again after them)."""
        if self._held >= self._limit:
            await self._room_or_end()
        if self._closed:
            return
        self._open.clear()
        self._append(response, len(response))

    async def put_text(self, responses: TextResponses, data: bytes | None, final: bool) -> None:
        """Hold a text response of the request ``responses`` encodes, carrying ``data`` (UTF-8
        text; None: no outputs, the empty final response) with the flag ``final``: joined to the
        request's waiting text response when it has one that can take it, else a response of its
        own. Waits for room and drops it once ended, as :meth:`put`."""
        if self._held >= self._limit:
            await self._room_or_end()
        if self._closed:
            return
        if data is None:  # the empty final response: after the request's text, on its own
            self._open.pop(responses, None)
            response = responses.encode(None, final)
            self._append(response, len(response))
            return
        waiting = self._open.get(responses)
        if waiting is not None:
            if waiting.size - responses.overhead + len(data) <= MERGED_BYTES:
                waiting.join(data, final)
                self._held += len(data)
                if final:
                    del self._open[responses]
                return
            del self._open[responses]  # full: this token starts the next response
        text = _Text(responses, data, final, responses.overhead + len(data))
        self._append(text, text.size)
        if not final:
            self._open[responses] = text

    async def _room_or_end(self) -> None:
        """Wait while the bytes held reach the limit and the stream goes on."""
        while self._held >= self._limit and not self._closed:
            self._room.clear()
            await self._room.wait()

    def _append(self, item: _Text | bytes, size: int) -> None:
        self._items.append(item)
        self._held += size
        self._ready.set()

    def close(self) -> None:
        """The end of the stream: the writer gets what is held, then ``None``. Idempotent."""
        self._closed = True
        self._open.clear()
        self._ready.set()
        self._room.set()  # a request still waiting to put drops its response and goes on

    async def get(self) -> bytes | None:
        """The next response, in the order they were put (a merged one at its first token's
        place); ``None`` once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, bytes):
            response, size = item, len(item)
        else:
            if self._open.get(item.responses) is item:
                del self._open[item.responses]
            response, size = item.encode(), item.size
        self._held -= size
        if self._held < self._limit:
            self._room.set()
        return response
