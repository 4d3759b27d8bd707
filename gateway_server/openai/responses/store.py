"""Responses in flight and stored ones, in this API process.

A response is held from its start to its end whatever its ``store``: its cancel answers its
object. When it ends, one with ``store: true`` is kept for ``--responses-ttl`` seconds; one
with ``store: false`` is forgotten. A client (``gateway_server.clients``) keeps at most
``--responses-stored-per-client`` stored responses, its own oldest dropped first when it stores
another, and all clients together at most ``--responses-max-stored``, the oldest dropped first:
so one client storing response after response drops only its own, never another's (until more
clients than the total holds for a share store at once). Background responses in flight are
bounded by the same total, and each client to ``--responses-background-per-client`` of them (a
new one past either is refused with 429: one client cannot take every slot), so memory is
bounded: each
record holds one answer's text and, for a background response, where each of its text deltas
ended (4 bytes a delta): a resumed stream (``GET ...?stream=true``) rebuilds the events from
those, byte for byte the ones the response emitted, rather than the gateway keeping every
event's bytes (226 for a one-word delta).

A record is held under the response's id, the gateway's own (random): the store takes a record
only under an id it holds nothing under, and keeps, when a response ends, only the record it
took for that response: nothing replaces a record another call made. Stored responses expire on
a timer of their own, not only when the store is next read.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway_server.errors import DuplicateRequestId, TooManyRequests
from gateway_server.openai.responses.objects import Answer, Events, Status, encode
from gateway_server.registry import SWEEP_GRANULE


@dataclass(eq=False)
class ResponseRecord:
    answer: Answer
    call_id: str
    store: bool
    background: bool
    turns: list[dict[str, Any]]
    """The conversation without the instructions; the answer is added when it ends."""
    client: str = ""
    """Who started it: the response counts in that client's shares (background responses in
    flight, stored responses), and its engine requests wait in that client's turn."""
    events: Events = field(init=False)
    task: asyncio.Task[None] | None = None
    _ends: array[int] = field(default_factory=lambda: array("I"))
    """Where each text delta ended in the answer's text (background responses only)."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ended: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.events = Events(self.answer)

    @property
    def id(self) -> str:
        return self.answer.id

    def emit(self, events: list[dict[str, Any]]) -> None:
        """Note a background response's events for the streams that follow it, and wake them."""
        if not self.background:
            return
        for event in events:
            if event["type"] == "response.output_text.delta":
                self._ends.append((self._ends[-1] if self._ends else 0) + len(event["delta"]))
        self._wake()

    def end(self) -> None:
        self._ended.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        await self._ended.wait()

    async def follow(self, after: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """A background response's events numbered after ``after``, each with its number, as it
        emitted them (rebuilt from its state: see the module doc), then each new one, until the
        last. The text deltas up to ``after`` are skipped, not rebuilt: a follower that resumes
        late (or asks again and again, from another API process) costs what it reads."""
        live = self.answer
        scratch = Answer(live.id, live.model, live.settings, live.created_at)
        events = Events(scratch)
        pending = [events.created(), events.queued()]
        scratch.status = Status.IN_PROGRESS  # the run sets it at once after its call opened
        pending.append(events.in_progress())
        shown = 0
        while True:
            changed = self._changed
            if live.started_output and not scratch.started_output:
                scratch.started_output = True
                pending += events.output_started()
            if scratch.started_output and events.next_number <= after:  # deltas it has
                skipped = min(after + 1 - events.next_number, len(self._ends) - shown)
                shown += skipped
                events.skip(skipped)
            for end in self._ends[shown:]:
                start = self._ends[shown - 1] if shown else 0
                pending.append(events.delta(live.text[start:end]))
                shown += 1
            if self.ended:
                _copy_end(live, scratch)
                pending += events.ended()
            for event in pending:
                if event["sequence_number"] > after:
                    yield event["sequence_number"], encode(event)
            pending = []
            if self.ended:
                return
            await changed.wait()


def _copy_end(live: Answer, scratch: Answer) -> None:
    scratch.status, scratch.text, scratch.error = live.status, live.text, live.error
    scratch.input_tokens, scratch.output_tokens = live.input_tokens, live.output_tokens
    scratch.completed_at = live.completed_at


class ResponseStore:
    def __init__(
        self,
        max_stored: int,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        background_per_client: int = 0,
        stored_per_client: int = 0,
    ) -> None:
        """``background_per_client``: the most background responses one client may have in
        flight; ``stored_per_client``: the most stored responses one client keeps (0: only
        ``max_stored`` bounds either)."""
        self._max = max_stored
        self._ttl = ttl
        self._clock = clock
        self._per_client = background_per_client
        self._stored_per_client = stored_per_client
        self._running: dict[str, ResponseRecord] = {}
        self._counted: set[ResponseRecord] = set()  # background responses in flight
        self._background: dict[str, int] = {}  # client → how many of them are its
        self._stored: OrderedDict[str, tuple[float, ResponseRecord]] = OrderedDict()
        self._kept: dict[str, OrderedDict[str, None]] = {}  # client → its stored ids, oldest first
        self._timer: asyncio.TimerHandle | None = None

    def start(self, record: ResponseRecord) -> None:
        """Hold a response from its start. Raises TooManyRequests for a background one past the
        bound, or past its client's share; DuplicateRequestId for an id held already (a response
        id is the gateway's own and random: it never is; the store refuses rather than replace a
        record)."""
        if record.id in self._running or self.get(record.id) is not None:
            raise DuplicateRequestId(f"response id {record.id} is held already")
        if record.background:
            if len(self._counted) >= self._max:
                raise TooManyRequests(
                    f"{len(self._counted)} background responses are in flight, the most this "
                    "gateway holds (--responses-max-stored); wait for one to end or cancel one"
                )
            held = self._background.get(record.client, 0)
            if self._per_client and held >= self._per_client:
                raise TooManyRequests(
                    f"{held} background responses of this client are in flight, the most one "
                    "client may hold (--responses-background-per-client); wait for one to end "
                    "or cancel one"
                )
            self._background[record.client] = held + 1
            self._counted.add(record)
        self._running[record.id] = record

    def _stop_running(self, record: ResponseRecord) -> None:
        if self._running.get(record.id) is record:
            del self._running[record.id]
        if record in self._counted:
            self._counted.remove(record)
            left = self._background[record.client] - 1
            if left:
                self._background[record.client] = left
            else:
                del self._background[record.client]

    def finish(self, record: ResponseRecord) -> None:
        """The response ended: keep it if it asked to be stored (only a record this store took
        for it), wake its followers."""
        ours = self._running.get(record.id) is record
        self._stop_running(record)
        record.end()
        if ours and record.store and self._max > 0:
            self._keep(record)
            if self._timer is None:
                self._arm()

    def _keep(self, record: ResponseRecord) -> None:
        """Store ``record``: past its client's share, that client's oldest goes; past the
        total, the oldest of all."""
        self._stored[record.id] = (self._clock() + self._ttl, record)
        kept = self._kept.setdefault(record.client, OrderedDict())
        kept[record.id] = None
        if self._stored_per_client and len(kept) > self._stored_per_client:
            self._drop(next(iter(kept)))
        while len(self._stored) > self._max:
            self._drop(next(iter(self._stored)))

    def _drop(self, response_id: str) -> bool:
        """Forget a stored response; False when none is stored under that id."""
        entry = self._stored.pop(response_id, None)
        if entry is None:
            return False
        client = entry[1].client
        kept = self._kept[client]
        del kept[response_id]
        if not kept:
            del self._kept[client]
        return True

    def forget(self, record: ResponseRecord) -> None:
        """A response that never ran (its call could not open): not stored."""
        self._stop_running(record)
        record.end()

    def get(self, response_id: str) -> ResponseRecord | None:
        """A response in flight (whatever its ``store``) or stored, else None."""
        running = self._running.get(response_id)
        if running is not None:
            return running
        self._expire()
        entry = self._stored.get(response_id)
        return None if entry is None else entry[1]

    def delete(self, response_id: str) -> bool:
        """Forget a stored response; False when none is stored under that id."""
        self._expire()
        return self._drop(response_id)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The background responses' tasks still running."""
        return [r.task for r in self._running.values() if r.task is not None]

    def __len__(self) -> int:
        self._expire()
        return len(self._stored)

    def _expire(self) -> None:
        # One TTL for every entry: insertion order is expiry order.
        now = self._clock()
        while self._stored and next(iter(self._stored.values()))[0] <= now:
            self._drop(next(iter(self._stored)))

    def _arm(self) -> None:
        """A sweep when the oldest stored response expires (as the registry's memories)."""
        if not self._stored:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (pure tests): expiry is on access
            return
        oldest = next(iter(self._stored.values()))[0]
        delay = max(oldest - self._clock(), SWEEP_GRANULE)
        self._timer = loop.call_later(delay, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        self._expire()
        self._arm()
