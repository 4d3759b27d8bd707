"""The calls this proxy holds, by id: what its own cancel by id finds (issue 49).

Every relayed call is held under the id it was sent upstream with and, when the client gave
another, the client's (``X-Request-Id`` as it came: the id an edge in front knows it by). When
the call ends, its ids are remembered as finished for ``ttl`` seconds; a cancel for an id the
proxy does not hold leaves a tombstone for as long, and a call that then arrives under that id is
refused as cancelled before it arrived (the gateway's contract: a cancel that beats its call
wins). Both memories are bounded (``limit`` ids each, the oldest forgotten first), so a client
cannot grow them without end.

:meth:`HeldCalls.cancel` ends what is held under an id and says how it went; the cancel API
(``proxy.http.cancel_api``) and, with ``--workers``, the other workers (``proxy.calls.siblings``)
ask it. No I/O here: a held call's ender (its listener's) makes the cancel call, if any.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from hangup_contract.vocabulary import Reason
from proxy.cancel.seams import CancelTask
from proxy.vocabulary import CancelResult


class Call(Protocol):
    """What is held of a call (``proxy.calls.state.Call`` is one): its ids."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def client_request_id(self) -> str | None: ...


Ender = Callable[[Reason], CancelTask | None]
"""How one held call is ended by id, the way its adapter ends a hang-up (its listener's): the
cancel made upstream, if one was."""


class _Expiring:
    """Ids remembered for ``ttl`` seconds, at most ``limit`` of them (the oldest go first)."""

    def __init__(self, ttl: float, limit: int) -> None:
        self._ttl, self._limit = ttl, limit
        self._until: OrderedDict[str, float] = OrderedDict()

    def add(self, key: str, now: float) -> None:
        self._until[key] = now + self._ttl
        self._until.move_to_end(key)
        while len(self._until) > self._limit:
            self._until.popitem(last=False)

    def take(self, key: str, now: float) -> bool:
        """Whether ``key`` is remembered (and forget it)."""
        until = self._until.pop(key, None)
        return until is not None and until > now

    def __contains__(self, key: str) -> bool:
        until = self._until.get(key)
        return until is not None and until > time.monotonic()

    def expire(self, now: float) -> None:
        while self._until:
            key, until = next(iter(self._until.items()))
            if until > now:
                return
            del self._until[key]


class HeldCalls:
    """The proxy's calls by id, its recently finished ids, and its tombstones."""

    def __init__(self, ttl: float = 60.0, limit: int = 65536) -> None:
        self._live: dict[str, dict[Call, Ender]] = {}
        self._finished = _Expiring(ttl, limit)
        self._tombstones = _Expiring(ttl, limit)
        self.on_spent: Callable[[str], None] = lambda request_id: None
        """Told the id of a tombstone a call spent (the other workers drop theirs)."""

    @staticmethod
    def _ids(call: Call) -> set[str]:
        return {i for i in (call.request_id, call.client_request_id) if i is not None}

    def hold(self, call: Call, ender: Ender) -> Reason | None:
        """Hold ``call`` under its ids, ended by ``ender`` if cancelled by id; or, when a
        tombstone names one of its ids, say so (the cancel's reason) and hold nothing."""
        now = time.monotonic()
        for key in self._ids(call):
            if self._tombstones.take(key, now):
                self.on_spent(key)
                return Reason.EXPLICIT
        for key in self._ids(call):
            self._live.setdefault(key, {})[call] = ender
        return None

    def release(self, call: Call) -> None:
        """``call`` ended: its ids are remembered as finished."""
        now = time.monotonic()
        for key in self._ids(call):
            calls = self._live.get(key)
            if calls is not None and calls.pop(call, None) is not None:
                if not calls:
                    del self._live[key]
                self._finished.add(key, now)

    def find(self, request_id: str) -> list[tuple[Call, Ender]]:
        """The calls held under ``request_id`` (usually one), each with its ender."""
        return list(self._live.get(request_id, {}).items())

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
        return "finished" if request_id in self._finished else None

    def unbury(self, request_id: str) -> None:
        """A call spent the id's tombstone elsewhere (another worker)."""
        self._tombstones.take(request_id, time.monotonic())

    def bury(self, request_id: str) -> None:
        """A cancel for an id not held: refuse a call that arrives under it within the ttl."""
        now = time.monotonic()
        self._tombstones.expire(now)
        self._finished.expire(now)
        self._tombstones.add(request_id, now)
