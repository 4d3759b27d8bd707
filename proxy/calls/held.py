"""The calls this proxy holds, by id: what its own cancel by id finds (issue 49), and what keeps
a client-chosen id from naming someone else's call (issue 59).

One table, id → slot, holds three kinds of slot:

- a **held call**, under the id it went upstream with and, when the client sent an id of its own
  that keeps the contract's rule (``hangup_contract.request_id``), under that one too (an alias:
  with ``--trust-client-request-id`` off, calls may share one). An id that breaks the rule is
  never kept: such a call is found by the id it went upstream with (echoed to its client);
- an **ended call's id**, remembered for ``ttl`` seconds: a cancel for it is answered
  ``finished``;
- a **tombstone**: a cancel for an id nobody held, remembered for ``ttl`` seconds; a call that
  arrives under it is refused as cancelled before it arrived (the gateway's contract).

A held call is also found by its answer's own id once its answer began (``chatcmpl-…``: what a
streaming client saw first; :meth:`HeldCalls.name`, an alias as the client's id is), and by its
group (``hangup_contract.jobs``; ``proxy.calls.groups``): :meth:`HeldCalls.cancel_group` ends
every call of a group held here.

A *trusted* id (the client's, sent upstream as it came) is the client's only while nobody else
holds it: :meth:`HeldCalls.hold` refuses one already held (``DuplicateRequestId``), and one that
extends a held id with ``:`` (the gateway's name for one request of a gRPC stream,
``<call id>:<request id>``), so that a client's hang-up only ever cancels the upstream call its
own call started. With ``--workers``, the relay asks the other workers too
(``Holding.trusted``, ``proxy.calls.siblings``).

Cost per call: its slot goes into the table when it is held (one dict insert) and becomes its
id's memory in place when it ends (a deque append, no dict operation); the delete comes when
the memory expires. The ended ids and the tombstones are each bounded in count and in bytes (the
oldest forgotten first), and expire by themselves: :meth:`HeldCalls.expire` runs on a timer
(:meth:`HeldCalls.start`), so the memory falls back to the calls in flight with no call or
cancel arriving. Held calls are as many as the calls in flight (``--max-concurrent-streams``),
each under at most two ids of at most 128 characters.

:meth:`HeldCalls.cancel` ends what is held under an id and says how it went; the cancel API
(``proxy.http.cancel_api``) and, with ``--workers``, the other workers (``proxy.calls.siblings``)
ask it. No I/O here: a held call's ender (its listener's) makes the cancel call, if any.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from hangup_contract import request_id as request_ids
from hangup_contract.cancel_labels import Reason
from proxy.calls.groups import GroupBounds, HeldGroups
from proxy.cancel.protocols import CancelTask
from proxy.errors import CancelledById, DuplicateRequestId, ProxyError
from proxy.labels import CancelResult

ID_COST = 200
"""Bytes an id in the table costs beyond its characters (the string's header, its slot, the
table's and the queue's entries: measured in ``tests/pure/test_proxy_held.py``)."""
EXPIRE_EVERY_S = 1.0  # how often remembered ids past their ttl are forgotten (at most)
GROUPS = GroupBounds()


class Call(Protocol):
    """What is held of a call (``proxy.calls.state.Call`` is one): its ids."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def client_request_id(self) -> str | None: ...

    @property
    def group(self) -> str | None: ...


Ender = Callable[[Reason], CancelTask | None]
"""How one held call is ended by id, the way its adapter ends a hang-up (its listener's): the
cancel made upstream, if one was."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much the proxy remembers of ids, per process (each memory on its own)."""

    ttl: float = 60.0  # --tombstone-ttl
    ended: int = 65536  # --ended-ids-max
    ended_bytes: int = 16 << 20  # --ended-ids-max-bytes
    tombstones: int = 65536  # --tombstones-max
    tombstone_bytes: int = 16 << 20  # --tombstones-max-bytes


class Holding:
    """What a held call holds: its slot under the id it went upstream with (``alias``: its
    slot under the client's id, when kept). Once the call ended (``call`` None), the slot is
    the id's memory until ``until``. Calls sharing an id are chained by ``next``, the newest
    first. ``trusted``: the id is the client's own, sent upstream as it came (with
    ``--workers``, the other workers are asked about it)."""

    __slots__ = (
        "alias", "call", "ender", "group", "key", "named", "next", "shared", "trusted", "until"
    )  # fmt: skip

    def __init__(self, key: str, call: Call | None, ender: Ender | None) -> None:
        self.key = key
        self.call = call
        self.ender = ender
        self.alias: Holding | None = None
        self.named: Holding | None = None  # its slot under its answer's own id (name)
        self.group: str | None = None  # the group it joined
        self.next: Holding | None = None
        self.shared = False  # ever chained with another: released the long way
        self.trusted = False
        self.until = 0.0


class _Tombstone:
    __slots__ = ("key", "until")

    def __init__(self, key: str) -> None:
        self.key = key
        self.until = 0.0


class _Remembered:
    """Ids remembered until they expire, oldest first, at most ``limit`` of them and ``most``
    bytes (``ID_COST`` each beyond its characters): what is over goes first."""

    def __init__(self, table: dict[str, Holding | _Tombstone], ttl: float, limit: int, most: int):
        self._table = table
        self._ttl, self._limit, self._most = ttl, limit, most
        self._queue: deque[Holding | _Tombstone] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, entry: Holding | _Tombstone, now: float) -> None:
        entry.until = now + self._ttl
        self._queue.append(entry)
        self.bytes += len(entry.key) + ID_COST
        while len(self._queue) > self._limit or self.bytes > self._most:
            self._forget(self._queue.popleft())

    def expire(self, now: float) -> None:
        queue = self._queue
        while queue and queue[0].until <= now:
            self._forget(queue.popleft())

    def _forget(self, entry: Holding | _Tombstone) -> None:
        self.bytes -= len(entry.key) + ID_COST
        if self._table.get(entry.key) is entry:  # not taken over by a newer slot since
            del self._table[entry.key]


class HeldCalls:
    """The proxy's calls by id, its recently ended ids, and its tombstones (the module)."""

    def __init__(
        self,
        bounds: Bounds = Bounds(),
        *,
        trust_client: bool = False,
        groups: GroupBounds = GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``groups``: the groups held at most (``proxy.calls.groups``)."""
        self._table: dict[str, Holding | _Tombstone] = {}
        self.groups = HeldGroups[Holding](groups)
        self._trust = trust_client
        self._clock = clock
        self._ended = _Remembered(self._table, bounds.ttl, bounds.ended, bounds.ended_bytes)
        self._tombs = _Remembered(
            self._table, bounds.ttl, bounds.tombstones, bounds.tombstone_bytes
        )
        self._timer: asyncio.TimerHandle | None = None
        self._every = min(EXPIRE_EVERY_S, bounds.ttl)
        self.live = 0  # held calls' slots
        self.live_bytes = 0
        self.on_spent: Callable[[str], None] = lambda request_id: None
        """Told the id of a tombstone a call spent (the other workers drop theirs)."""
        self.on_expired: Callable[[HeldCalls], None] = lambda held: None
        """Told after each expiry on the timer (the metrics read the sizes)."""

    # -- a call's way through ------------------------------------------------------------

    def hold(self, call: Call, ender: Ender) -> Holding:
        """Hold ``call`` under its ids, ended by ``ender`` if cancelled by id.

        Raises ``CancelledById`` when a tombstone names one of its ids (spent: the call is
        refused as cancelled before it arrived), and ``DuplicateRequestId`` when its id is the
        client's own (``--trust-client-request-id``) and another call holds it, or holds the id
        it extends with ``:``; ``CancelledById`` or ``TooManyGroupCalls`` for its group
        (``HeldGroups.join``). Nothing is held then.
        """
        key = call.request_id
        assert key is not None
        slot = Holding(key, call, ender)
        client = call.client_request_id
        if client is not None:
            self._hold_named(slot, client)
        elif self._table.setdefault(key, slot) is not slot:  # a fresh id: nobody names it
            self._take(slot, trusted=False)
        self.live += 1
        self.live_bytes += len(key) + ID_COST
        group = call.group
        if group is not None:
            try:
                self.groups.join(group, slot, self._clock())
            except ProxyError:
                self.drop(slot)
                raise
            slot.group = group
        return slot

    def name(self, holding: Holding, answer_id: str) -> None:
        """Hold the call also under its answer's own id (an alias, as a client's id is), once:
        an id that breaks the rule, or that a tombstone names (spent), is not kept."""
        if holding.call is None or holding.named is not None or answer_id == holding.key:
            return
        if not request_ids.is_valid(answer_id):
            return
        slot = Holding(answer_id, holding.call, holding.ender)
        try:
            self._take(slot, trusted=False)
        except CancelledById:
            return
        holding.named = slot
        self.live_bytes += len(answer_id) + ID_COST

    def _hold_named(self, slot: Holding, client: str) -> None:
        """Hold ``slot`` when its client sent an id: trusted and checked, or kept as an alias
        when it keeps the rule."""
        if client == slot.key:  # --trust-client-request-id: the client's id went upstream
            slot.trusted = self._trust
            self._take(slot, trusted=self._trust)
            return
        self._take(slot, trusted=False)
        if not request_ids.is_valid(client):
            return
        alias = Holding(client, slot.call, slot.ender)
        try:
            self._take(alias, trusted=False)
        except CancelledById:
            self._drop(slot)
            raise
        slot.alias = alias
        self.live_bytes += len(client) + ID_COST

    def _take(self, slot: Holding, *, trusted: bool) -> None:
        """Put ``slot`` in the table under its id, whatever is there (see :meth:`hold`)."""
        key = slot.key
        if trusted and ":" in key and self._holds_prefix(key):
            raise DuplicateRequestId(f"request id {key!r} is already in flight")
        found = self._table.setdefault(key, slot)
        if found is slot:
            return
        if isinstance(found, _Tombstone):
            del self._table[key]
            self.on_spent(key)
            raise CancelledById(f"request {key} was cancelled by id before it arrived")
        if found.call is None:  # an ended call's memory: the id is free again
            self._table[key] = slot
        elif trusted:
            raise DuplicateRequestId(f"request id {key!r} is already in flight")
        else:  # an alias other calls share (or a guessed fresh id): all are held under it
            slot.next, slot.shared, found.shared = found, True, True
            self._table[key] = slot

    def release(self, holding: Holding) -> None:
        """The call ended: each of its ids is remembered as ended (once no other call holds
        it)."""
        now = self._clock()
        self.live -= 1
        self.live_bytes -= len(holding.key) + ID_COST
        if holding.group is not None:
            self.groups.leave(holding.group, holding)
        for alias in (holding.alias, holding.named):
            if alias is not None:
                self.live_bytes -= len(alias.key) + ID_COST
                self._leave(alias, now)
        if holding.shared:
            self._unchain(holding, now)
        else:
            holding.call = holding.ender = None
            self._ended.add(holding, now)

    def _leave(self, slot: Holding, now: float) -> None:
        if slot.shared:
            self._unchain(slot, now)
        else:
            slot.call = slot.ender = None
            self._ended.add(slot, now)

    def drop(self, holding: Holding) -> None:
        """Give the call's slots back with no memory of them: it was refused before it ran."""
        self.live -= 1
        self.live_bytes -= len(holding.key) + ID_COST
        if holding.group is not None:
            self.groups.leave(holding.group, holding)
        for alias in (holding.alias, holding.named):
            if alias is not None:
                self.live_bytes -= len(alias.key) + ID_COST
                self._drop(alias)
        self._drop(holding)

    def _drop(self, slot: Holding) -> None:
        if slot.shared:
            self._unchain(slot, None)
        elif self._table.get(slot.key) is slot:
            del self._table[slot.key]

    def _unchain(self, slot: Holding, now: float | None) -> None:
        """Take ``slot`` out of the calls sharing its id; the last one out leaves the id's
        memory (``now`` given) or nothing."""
        head = self._table.get(slot.key)
        others = [s for s in _chain(head) if s is not slot and s.call is not None]
        for at, one in enumerate(others, 1):
            one.next = others[at] if at < len(others) else None
        slot.call = slot.ender = slot.next = None
        if others:
            self._table[slot.key] = others[0]
        elif now is not None:
            slot.shared = False
            self._table[slot.key] = slot
            self._ended.add(slot, now)
        elif isinstance(head, Holding):
            del self._table[slot.key]

    def _holds_prefix(self, key: str) -> bool:
        """Whether a call is held under an id that ``key`` extends with ``:``."""
        at = key.find(":")
        while at > 0:
            found = self._table.get(key[:at])
            if isinstance(found, Holding) and found.call is not None:
                return True
            at = key.find(":", at + 1)
        return False

    # -- what the cancel API and the other workers ask -------------------------------------

    def holds(self, request_id: str) -> bool:
        """Whether a call is held under ``request_id``, or under an id it extends with ``:``
        (a trusted id then is not free: the other workers ask this)."""
        found = self._table.get(request_id)
        held = isinstance(found, Holding) and found.call is not None
        return held or self._holds_prefix(request_id)

    def find(self, request_id: str) -> list[tuple[Call, Ender]]:
        """The calls held under ``request_id`` (usually one), each with its ender."""
        held = []
        for slot in _chain(self._table.get(request_id)):
            if slot.call is not None and slot.ender is not None:
                held.append((slot.call, slot.ender))
        return held

    async def cancel(self, request_id: str) -> str | None:
        """End every call held under ``request_id`` (reason ``explicit``) and say how it went:
        ``cancelled``, or ``finished`` when the upstream says each had already ended, or when
        the id's call ended within the ttl; None when nothing is known of it here. Returns once
        each call's cancel call, if one was made, has its answer."""
        held = self.find(request_id)
        if held:
            cancels = [c for c in (end(Reason.EXPLICIT) for _, end in held) if c is not None]
            results = await asyncio.gather(*cancels) if cancels else []
            finished = bool(results) and all(r is CancelResult.FINISHED for r in results)
            return "finished" if finished else "cancelled"
        found = self._table.get(request_id)
        ended = isinstance(found, Holding) and found.until > self._clock()
        return "finished" if ended else None

    async def cancel_group(self, group: str) -> list[tuple[Call, str]]:
        """End every call of ``group`` held here (reason ``explicit``), and refuse its calls
        that arrive within the ttl; each call with how it went (``cancelled``, or ``finished``
        when the upstream says it had already ended), once each cancel call has its answer."""
        held = [s for s in self.groups.calls(group) if s.call is not None and s.ender is not None]
        self.groups.bury(group, self._clock())
        ended = [(s.call, s.ender(Reason.EXPLICIT)) for s in held if s.call and s.ender]
        results = await asyncio.gather(*(c for _, c in ended if c is not None))
        answers, at = [], 0
        for call, cancel in ended:
            state = "cancelled"
            if cancel is not None:
                state = "finished" if results[at] is CancelResult.FINISHED else "cancelled"
                at += 1
            answers.append((call, state))
        return answers

    def bury(self, request_id: str) -> None:
        """A cancel for an id not held: refuse a call that arrives under it within the ttl.
        An id that breaks the rule is not kept (no call is ever held under one)."""
        if not request_ids.is_valid(request_id):
            return
        found = self._table.get(request_id)
        if isinstance(found, Holding) and found.call is not None:
            return  # it arrived meanwhile: held, not buried
        tombstone = _Tombstone(request_id)
        self._table[request_id] = tombstone
        self._tombs.add(tombstone, self._clock())

    def buried(self, request_id: str) -> bool:
        """Whether a tombstone waits for ``request_id``."""
        found = self._table.get(request_id)
        return isinstance(found, _Tombstone) and found.until > self._clock()

    def unbury(self, request_id: str) -> None:
        """A call spent the id's tombstone elsewhere (another worker)."""
        if isinstance(self._table.get(request_id), _Tombstone):
            del self._table[request_id]

    # -- expiry and sizes --------------------------------------------------------------------

    def expire(self) -> None:
        """Forget every remembered id past its ttl."""
        now = self._clock()
        self._ended.expire(now)
        self._tombs.expire(now)
        self.groups.expire(now)

    def start(self) -> None:
        """Expire on a timer, every second (or ``ttl``, if shorter), in the running loop."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.expire()
            self.on_expired(self)
            self._timer = loop.call_later(self._every, tick)

        self._timer = loop.call_later(self._every, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sizes(self) -> dict[str, tuple[int, int]]:
        """For each memory (``live``, ``ended``, ``tombstone``, ``group_tombstone``): its ids
        and their bytes."""
        _, buried, buried_bytes = self.groups.sizes()
        return {
            "live": (self.live, self.live_bytes),
            "ended": (len(self._ended), self._ended.bytes),
            "tombstone": (len(self._tombs), self._tombs.bytes),
            "group_tombstone": (buried, buried_bytes),
        }


def _chain(slot: Holding | _Tombstone | None) -> Iterator[Holding]:
    while isinstance(slot, Holding):
        yield slot
        slot = slot.next
