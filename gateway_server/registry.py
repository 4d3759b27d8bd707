"""Calls in flight, the ones that ended recently, and tombstones for cancels that came first.

A *call* is one upstream call (one HTTP request, one gRPC call) identified by its request id.
It holds one or more *engine requests* (``n > 1`` choices, the requests of a gRPC stream).
Cancelling the call id cancels all of them; an engine request may also carry an *alias* (an id
of its own, e.g. one request of a gRPC stream) that cancels it alone.

Memory is bounded: finished calls and tombstones are kept for a TTL, each memory within its
:class:`IdBounds` (ids and bytes), oldest dropped first, and they expire on a timer of their own
(:class:`Remembered`). An alias (a stream request's cancel id) is held to the
cancel rule (``hangup_contract.request_id.is_cancel_id``): no id longer than that is held.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway_server.engine.base import Consumption, Share
from gateway_server.errors import (
    CancelledBeforeArrival,
    DuplicateRequestId,
    InvalidRequest,
    RequestNotFound,
)
from gateway_server.groups import GROUP_BOUNDS, GroupBounds, Groups
from gateway_server.labels import Protocol
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.placement import Placement
from gateway_server.placement.legs import merge_answers
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import CancelState, Phase, Reason
from hangup_contract.usage import Usage

V = TypeVar("V")


ENTRY_BYTES = 172
"""What one remembered id costs beside its string (``sys.getsizeof``): the ordered dict's node,
the tuple and the float of its expiry (measured with tracemalloc: 252 bytes for a 32-character
id, 476 for a 256-character one)."""
SWEEP_GRANULE = 0.5
"""Seconds at least between two sweeps of one memory's expired ids (see :class:`Remembered`)."""


@dataclass(frozen=True, slots=True)
class IdBounds:
    """What one memory of ids holds at most: ``count`` ids and ``size`` bytes of them (each id's
    string and :data:`ENTRY_BYTES`), the oldest dropped first."""

    count: int = 100_000
    size: int = 16 * 1024 * 1024


ID_BOUNDS = IdBounds()
"""The defaults (``--ended-ids-max``/``--tombstones-max`` and their ``-bytes``)."""


class Remembered(Generic[V]):
    """Ids remembered for ``ttl`` seconds, within ``bounds`` (in ids and bytes), oldest dropped
    first.

    Expired ids go by themselves: the first id put arms a timer on the running loop for when the
    oldest expires, and each sweep arms it for the next (at most one sweep every
    :data:`SWEEP_GRANULE`), so memory a client filled is given back at its TTL, not when some
    later call happens to look. (Without a running loop, as in pure tests, expiry is on access.)
    """

    def __init__(self, ttl: float, bounds: IdBounds, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._limit = bounds.count
        self._max_bytes = bounds.size
        self._clock = clock
        self._store: OrderedDict[str, tuple[float, V]] = OrderedDict()  # expiry, value
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    def put(self, request_id: str, value: V) -> None:
        store = self._store
        if request_id in store:
            store.move_to_end(request_id)
        else:
            self._bytes += _cost(request_id)
        store[request_id] = (self._clock() + self._ttl, value)
        while len(store) > self._limit or self._bytes > self._max_bytes:
            self._bytes -= _cost(store.popitem(last=False)[0])
        if self._timer is None:
            self._arm()

    def get(self, request_id: str) -> V | None:
        self._expire()
        entry = self._store.get(request_id)
        return None if entry is None else entry[1]

    def pop(self, request_id: str) -> V | None:
        self._expire()
        entry = self._store.pop(request_id, None)
        if entry is None:
            return None
        self._bytes -= _cost(request_id)
        return entry[1]

    @property
    def bytes(self) -> int:
        """What the ids held cost (see :data:`ENTRY_BYTES`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._store)

    def _expire(self) -> None:
        # One TTL for every entry: insertion order is expiry order.
        now = self._clock()
        store = self._store
        while store and next(iter(store.values()))[0] <= now:
            self._bytes -= _cost(store.popitem(last=False)[0])

    def _arm(self) -> None:
        """A sweep when the oldest id expires (none while nothing is held or no loop runs)."""
        if not self._store:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        oldest = next(iter(self._store.values()))[0]
        delay = max(oldest - self._clock(), SWEEP_GRANULE)
        self._timer = loop.call_later(delay, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        self._expire()
        self._arm()


def _cost(request_id: str) -> int:
    return sys.getsizeof(request_id) + ENTRY_BYTES


@dataclass(eq=False)
class EngineCall:
    """One engine request inside a call."""

    engine_request_id: str
    placement: Placement
    """Where it runs (:mod:`gateway_server.placement`): one worker, or two legs."""
    alias: str | None = None
    share: Share = field(default_factory=Share)
    """Whose turn it waits for in an engine's admission queue (its call's client, its call)."""
    generated_tokens: int = 0
    """Tokens of its chunks read so far (its engine may have generated more: ``consumption``)."""
    cancel_reason: Reason | None = None
    cancel_phase: Phase | None = None
    started_decode: bool = False
    consumption: Consumption = field(default_factory=Consumption)
    """What its engines say it consumed (``Engine`` writes it, see ``engine.base``)."""
    bills_prompt: bool = True
    """Its prompt counts in its call's usage: false for choices 2..n of one prompt (OpenAI's
    usage counts each prompt once, however many choices it has)."""

    def usage(self) -> Usage:
        """What it consumed so far, as its call's usage counts it."""
        consumed = self.consumption
        prompt = consumed.prompt_tokens if self.bills_prompt else 0
        return Usage(prompt, max(consumed.output_tokens, self.generated_tokens))

    async def abort(self) -> None:
        """Abort it wherever it runs (both legs, and the KV between them, when split)."""
        await self.placement.abort()

    def phase(self) -> Phase:
        return self.placement.phase(self.started_decode)


@dataclass(eq=False)
class Call:
    call_id: str
    model: str
    protocol: Protocol
    started: float
    hangup_reason: Reason = Reason.CLIENT_DISCONNECT
    """Reason recorded if the handler is cancelled under this call (the client went away)."""
    client: str = ""
    """Who sent it, for fair shares (``gateway_server.clients``)."""
    group: str | None = None
    """The job it belongs to (``hangup_contract.jobs``): a group cancel ends it."""
    requests: dict[str, EngineCall] = field(default_factory=dict)
    cancel_reason: Reason | None = None
    generated_tokens: int = 0
    """Tokens of every engine request of this call, finished ones included."""
    usage: Usage = field(default_factory=Usage)
    """What its engine requests that ended consumed (see :meth:`EngineCall.usage`); with the
    live ones', what the call consumed so far (:meth:`consumed`)."""
    _seq: int = 0

    def next_engine_request_id(self) -> str:
        self._seq += 1
        return f"{self.call_id}-{self._seq}"

    def consumed(self) -> Usage:
        """What the call consumed so far: its ended engine requests' and its live ones'."""
        usage = self.usage
        for request in list(self.requests.values()):
            usage += request.usage()
        return usage

    def phase(self) -> Phase:
        """The furthest phase among live engine requests (queued when none is live)."""
        phases = [r.phase() for r in self.requests.values()]
        return max(phases, key=lambda p: p.rank, default=Phase.QUEUED)


class CallRegistry:
    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        tombstone_ttl: float = 60.0,
        finished_ttl: float = 600.0,
        ended: IdBounds = ID_BOUNDS,
        tombstones: IdBounds = ID_BOUNDS,
        groups: GroupBounds = GROUP_BOUNDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``groups``: the groups held at most (``gateway_server.groups``); the groups
        cancelled are remembered as the tombstones are (``tombstone_ttl``, ``tombstones``)."""
        self._metrics = metrics
        self._live: dict[str, Call] = {}
        self._aliases: dict[str, tuple[Call, EngineCall]] = {}
        self._ended = Remembered[int](finished_ttl, ended, clock)  # tokens
        self._tombstones = Remembered[Reason](tombstone_ttl, tombstones, clock)
        self._groups = Groups[Call](groups, Remembered[Reason](tombstone_ttl, tombstones, clock))
        self._clock = clock
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle of a call ---------------------------------------------------------------

    def open(self, call_id: str, model: str, protocol: Protocol, group: str | None = None) -> Call:
        """Register a call (of ``group``, if given). Raises DuplicateRequestId (in flight),
        CancelledBeforeArrival (its id, or its group, was cancelled first), or TooManyRequests
        (a bound on groups, ``gateway_server.groups``)."""
        if call_id in self._live or call_id in self._aliases:
            raise DuplicateRequestId(f"request id {call_id!r} is already in flight")
        tomb = self._tombstones.pop(call_id)
        if tomb is not None:
            raise CancelledBeforeArrival(call_id, tomb)
        call = Call(call_id, model, protocol, self._clock(), group=group)
        if group is not None:
            self._groups.join(group, call_id, call)
        self._live[call_id] = call
        self._idle.clear()
        return call

    def close(self, call: Call, *, remember: bool = True) -> None:
        """Forget a call's live state; remember that it ended (later cancels answer finished),
        unless ``remember`` is false (a call refused before it ran)."""
        if self._live.get(call.call_id) is not call:
            return
        del self._live[call.call_id]
        if call.group is not None:
            self._groups.leave(call.group, call.call_id)
        if remember:
            self._ended.put(call.call_id, call.generated_tokens)
        if not self._live:
            self._idle.set()

    def attach(self, call: Call, request: EngineCall) -> None:
        """Add an engine request to ``call``. Raises InvalidRequest when its alias breaks the
        cancel rule (too long to be named by a cancel), DuplicateRequestId when its alias is in
        flight, CancelledBeforeArrival when a cancel for its alias came first (a request that
        waited, e.g. behind others of its gRPC sequence)."""
        if request.alias is not None:
            if not request_ids.is_cancel_id(request.alias):
                raise InvalidRequest(
                    f"a stream request's id makes its cancel id '<call id>:<id>', which must be "
                    f"at most {request_ids.ALIAS_MAX} characters"
                )
            if request.alias in self._aliases or request.alias in self._live:
                raise DuplicateRequestId(f"request id {request.alias!r} is already in flight")
            tomb = self._tombstones.pop(request.alias)
            if tomb is not None:
                raise CancelledBeforeArrival(request.alias, tomb)
            self._aliases[request.alias] = (call, request)
        call.requests[request.engine_request_id] = request

    def detach(self, call: Call, request: EngineCall, *, remember: bool = True) -> None:
        call.requests.pop(request.engine_request_id, None)
        alias = request.alias
        if alias is not None and self._aliases.pop(alias, None) is not None and remember:
            self._ended.put(alias, request.generated_tokens)

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        """Cancel a call (all its engine requests) or one aliased engine request. Idempotent.

        Returns once every engine confirmed its abort. Raises RequestNotFound for an id never
        seen, after leaving a tombstone so that the request, if it is still on its way, is
        rejected when it arrives.
        """
        answer = await self.cancel_live(request_id, reason) or self.finished(request_id)
        if answer is not None:
            return answer
        self.leave_tombstone(request_id, reason)
        raise not_found(request_id)

    async def cancel_live(self, request_id: str, reason: Reason) -> CancelAnswer | None:
        """Cancel ``request_id`` if it is in flight here (a call or an alias), else None."""
        call = self._live.get(request_id)
        if call is not None:
            if call.cancel_reason is None:
                call.cancel_reason = reason
            phase = call.phase()
            tokens = call.generated_tokens
            requests = list(call.requests.values())
            await self.abort_requests(call, requests, reason)
            legs = _legs_answer(requests)
            usage = call.consumed()
            return CancelAnswer(request_id, CancelState.CANCELLED, phase, tokens, legs, usage)
        alias = self._aliases.get(request_id)
        if alias is not None:
            owner, request = alias
            phase = request.phase()
            await self.abort_requests(owner, [request], reason)
            tokens = request.generated_tokens
            legs = _legs_answer([request])
            usage = request.usage()  # a stream's request: its prompt is its own
            return CancelAnswer(request_id, CancelState.CANCELLED, phase, tokens, legs, usage)
        return None

    def finished(self, request_id: str) -> CancelAnswer | None:
        """The answer for an id that ended here recently, else None."""
        tokens = self._ended.get(request_id)
        if tokens is None:
            return None
        return CancelAnswer(request_id, CancelState.FINISHED, None, tokens)

    def leave_tombstone(self, request_id: str, reason: Reason) -> None:
        """Refuse ``request_id`` if it arrives within the tombstone TTL (a cancel came first)."""
        self._tombstones.put(request_id, reason)

    async def cancel_group(self, group: str, reason: Reason) -> list[CancelAnswer]:
        """Cancel every call of ``group`` in flight here, and refuse the group's calls that
        open within the tombstone ttl. Returns each call's answer once its engines confirmed
        (``finished`` for one that ended meanwhile)."""
        calls = self._groups.calls(group)
        self._groups.bury(group, reason)
        answers = await asyncio.gather(*(self.cancel_live(c.call_id, reason) for c in calls))
        ended = CancelState.FINISHED
        return [
            answer or self.finished(call.call_id) or CancelAnswer(call.call_id, ended, None, 0)
            for call, answer in zip(calls, answers, strict=True)
        ]

    async def cancel_all(self, reason: Reason) -> int:
        """Cancel every call in flight (shutdown). Returns how many calls were cancelled."""
        calls = list(self._live.values())
        await asyncio.gather(*(self.cancel(c.call_id, reason) for c in calls))
        return len(calls)

    async def abort_requests(self, call: Call, requests: list[EngineCall], reason: Reason) -> None:
        """Record ``reason`` and the phase on each request not yet cancelled, abort them on their
        engines, and return once every engine confirmed. Cancels already under way are not
        repeated (the first reason wins)."""
        started = time.perf_counter()
        pending = [r for r in requests if r.cancel_reason is None]
        # A split request whose cancel is under way: wait for it, so that this cancel too
        # answers only once both legs and the KV between them are freed.
        joined = [r for r in requests if r.cancel_reason is not None and r.placement.joins_cancels]
        for r in pending:
            r.cancel_reason = reason
            r.cancel_phase = r.phase()
        if joined:
            await asyncio.gather(*(r.abort() for r in joined))
        if not pending:
            return
        if len(pending) == 1:  # the common case, without gather's extra hop through the loop
            await pending[0].abort()
        else:
            await asyncio.gather(*(r.abort() for r in pending))
        elapsed = time.perf_counter() - started
        for request in pending:
            self._metrics.cancel_to_abort.labels(call.model).observe(elapsed)
            if request.placement.frees_kv:
                self._metrics.cancel_to_freed.labels(call.model).observe(elapsed)

    # -- reading ---------------------------------------------------------------------------

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` (a call or an alias) is in flight here."""
        return request_id in self._live or request_id in self._aliases

    def held_ids(self) -> list[str]:
        """Every id in flight here: calls and aliases."""
        return [*self._live, *self._aliases]

    def calls(self) -> Iterator[Call]:
        return iter(list(self._live.values()))

    def phases_in_flight(self) -> Iterator[tuple[str, Phase]]:
        """The model and phase of every engine request in flight here."""
        for call in self.calls():
            for request in list(call.requests.values()):
                yield call.model, request.phase()

    def describe(self) -> list[dict[str, object]]:
        """The calls in flight here, as ``GET /v2/requests`` lists them."""
        now = self._clock()
        return [
            {
                "request_id": call.call_id,
                "group": call.group,
                "model": call.model,
                "protocol": call.protocol.value,
                "phase": call.phase().value,
                "age_s": round(now - call.started, 3),
                "generated_tokens": call.generated_tokens,
                "engine_requests": len(call.requests),
                "cancelling": call.cancel_reason.value if call.cancel_reason else None,
                **_legs_of(call),
            }
            for call in self.calls()
        ]

    def handoffs(self) -> list[Placement]:
        """Engine requests here whose prompt's KV is held for a decode worker (in transfer)."""
        return [
            r.placement
            for call in self.calls()
            for r in list(call.requests.values())
            if r.placement.holds_handoff
        ]

    @property
    def remembered_bytes(self) -> int:
        """What the ended ids, tombstones and groups cancelled held here cost (see
        :class:`Remembered`)."""
        return self._ended.bytes + self._tombstones.bytes + self._groups.buried.bytes

    def __len__(self) -> int:
        return len(self._live)

    async def wait_idle(self) -> None:
        await self._idle.wait()


def not_found(request_id: str) -> RequestNotFound:
    return RequestNotFound(f"no request with id {request_id!r} is in flight or ended recently")


def _legs_answer(requests: list[EngineCall]) -> dict[str, dict[str, object]] | None:
    """The cancel answer's ``legs`` for these engine requests; None when none is split."""
    answers = [a for r in requests if (a := r.placement.answer()) is not None]
    return merge_answers(answers) if answers else None


def _legs_of(call: Call) -> dict[str, object]:
    """``GET /v2/requests``' ``legs`` of a split call (each leg of each request)."""
    legs = [leg for r in list(call.requests.values()) for leg in r.placement.describe()]
    return {"legs": legs} if legs else {}
