"""The call directory over the sibling channel: claims, releases, cancels and the listing.

Every request id has a home process, :func:`home_of`; the home's :class:`HomeEntries` say which
process runs the id, that it ended (with its tokens), or that a cancel came first (a
tombstone). :class:`SiblingDirectory` is what the service calls (a
:class:`~gateway_server.siblings.scope.CallDirectory`) and what a sibling's questions reach. The
rules it keeps are the package's (:mod:`gateway_server.siblings`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from gateway_server.errors import (
    CancelledBeforeArrival,
    DuplicateRequestId,
    GatewayError,
    RequestNotFound,
)
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import ID_BOUNDS, CallRegistry, IdBounds, Remembered, not_found
from gateway_server.siblings.ops import Op
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import CancelState, Reason
from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.sibling_lines import Message, integer, text
from hangup_contract.runtime.siblings import Channel, SiblingUnreachable, home_of

log = logging.getLogger("hangup.gateway")

CANCEL_WAIT = 30.0  # seconds for a forwarded cancel (the owner waits for its engines' abort)


class HomeEntries:
    """The ids whose home is this process: where each runs, which ended, which were cancelled
    before they arrived. Bounded like the registry (same TTLs and limits, in ids and bytes, and
    expiring on a timer of their own). ``live`` holds only ids in flight somewhere: each runs a
    call held to the id rule, and leaves it when the call ends or its owner restarts."""

    def __init__(
        self,
        tombstone_ttl: float,
        finished_ttl: float = 600.0,
        ended: IdBounds = ID_BOUNDS,
        tombstones: IdBounds = ID_BOUNDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.live: dict[str, int] = {}  # id -> owner
        self.ended = Remembered[int](finished_ttl, ended, clock)
        self.tombstones = Remembered[Reason](tombstone_ttl, tombstones, clock)

    def claim(self, request_id: str, owner: int) -> None:
        """Record that ``owner`` runs ``request_id``. Raises DuplicateRequestId or
        CancelledBeforeArrival (the tombstone is spent)."""
        if request_id in self.live:
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        reason = self.tombstones.pop(request_id)
        if reason is not None:
            raise CancelledBeforeArrival(request_id, reason)
        self.live[request_id] = owner

    def release(self, request_id: str, owner: int, tokens: int) -> None:
        if self.live.get(request_id) == owner:
            del self.live[request_id]
            self.ended.put(request_id, tokens)

    def forget(self, owner: int) -> None:
        """``owner`` started afresh: what it ran before died with it."""
        for request_id in [i for i, o in self.live.items() if o == owner]:
            del self.live[request_id]


class SiblingDirectory:
    """This process's calls as part of the gateway's: claimed at their homes, cancelled
    wherever they run, listed with every sibling's."""

    def __init__(
        self,
        channel: Channel,
        registry: CallRegistry,
        metrics: GatewayMetrics,
        *,
        tombstone_ttl: float,
        ended: IdBounds = ID_BOUNDS,
        tombstones: IdBounds = ID_BOUNDS,
    ) -> None:
        self.slot = channel.slot
        self.count = channel.count
        self.entries = HomeEntries(tombstone_ttl, ended=ended, tombstones=tombstones)
        self._channel = channel
        self._registry = registry
        self._metrics = metrics
        channel.on(Op.HELLO, self._on_hello)
        channel.on(Op.CLAIM, self._on_claim)
        channel.on(Op.RELEASE, self._on_release)
        channel.on(Op.CALLS, lambda _: {"calls": registry.describe()})
        channel.on_awaited(Op.CANCEL, self._on_cancel)
        channel.on_awaited(Op.CANCEL_OWNED, self._on_cancel)
        channel.on_awaited(Op.CANCEL_GROUP, self._on_cancel_group)

    def home(self, request_id: str) -> int:
        return home_of(request_id, self.count)

    def fresh_id(self) -> str:
        """A fresh random id whose home is this process: its claim and release stay here (no
        round trip to a sibling, none held up by a sibling that is busy or stalled), and a
        cancel of it asks its home, which runs it. One in ``count`` ids qualifies."""
        while True:
            request_id = request_ids.new_request_id()
            if home_of(request_id, self.count) == self.slot:
                return request_id

    async def greet(self) -> None:
        """Say hello (the channel listens already): siblings forget this slot's previous life
        and send the entries whose home this process is."""
        answers = await self._channel.ask_all(Op.HELLO, {"slot": self.slot})
        for peer, answer in answers.answered.items():
            for request_id in answer.get("live", ()):
                if isinstance(request_id, str):
                    self.entries.live.setdefault(request_id, peer)

    # -- what the service calls ------------------------------------------------------------

    async def claim(self, request_id: str) -> None:
        """Claim ``request_id`` for this process at its home (it must be open here already).
        Raises DuplicateRequestId or CancelledBeforeArrival."""
        home = self.home(request_id)
        if home == self.slot:
            self.entries.claim(request_id, self.slot)
            return
        try:
            answer = await self._channel.ask(home, Op.CLAIM, {"id": request_id, "owner": self.slot})
        except SiblingUnreachable as exc:
            log_event(
                log,
                "claim_unchecked",
                logging.WARNING,
                request_id=request_id,
                home=home,
                error=str(exc),
            )
            return
        error = answer.get("error")
        if error == "duplicate":
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        if error == "cancelled":
            raise CancelledBeforeArrival(request_id, Reason.parse(answer["reason"]))

    def release(self, request_id: str, tokens: int) -> None:
        """``request_id`` ended here after ``tokens`` tokens (its home remembers)."""
        home = self.home(request_id)
        if home == self.slot:
            self.entries.release(request_id, self.slot, tokens)
        else:
            fields = {"id": request_id, "owner": self.slot, "tokens": tokens}
            self._channel.tell(home, Op.RELEASE, fields)

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The cancel contract over every process (see :mod:`gateway_server.siblings`)."""
        answer = await self._registry.cancel_live(request_id, reason)
        if answer is not None:
            return answer
        home = self.home(request_id)
        if home == self.slot:
            return await self._cancel_at_home(request_id, reason)
        try:
            reply = await self._forward(home, Op.CANCEL, request_id, reason)
        except SiblingUnreachable as exc:
            log_event(
                log,
                "cancel_home_unreachable",
                logging.WARNING,
                request_id=request_id,
                home=home,
                error=str(exc),
            )
            return await self._cancel_everywhere(request_id, reason)
        return _answer_of(reply, request_id)

    async def cancel_group(self, group: str, reason: Reason) -> list[dict[str, object]]:
        """The group's calls cancelled in every process at once (a call of it may run, or
        arrive, at any), each answer as its process gave it. A process that does not answer
        within the cancel's wait is logged: what it runs of the group is not in the answer."""
        fields = {"group": group, "reason": reason.value}
        here, replies = await asyncio.gather(
            self._registry.cancel_group(group, reason),
            self._channel.ask_all(Op.CANCEL_GROUP, fields, CANCEL_WAIT),
        )
        answers: list[dict[str, object]] = [a.to_json() for a in here]
        for reply in replies.answered.values():
            answers.extend(a for a in reply.get("answers", ()) if isinstance(a, dict))
        if len(replies.answered) < self.count - 1:
            log_event(
                log, "cancel_group_unanswered", logging.WARNING, group=group,
                answered=len(replies.answered), siblings=self.count - 1,
            )  # fmt: skip
        return answers

    async def all_calls(self) -> list[dict[str, object]]:
        calls = self._registry.describe()
        for answer in (await self._channel.ask_all(Op.CALLS)).answered.values():
            calls.extend(c for c in answer.get("calls", ()) if isinstance(c, dict))
        return calls

    # -- the home's and the owner's side ---------------------------------------------------

    async def _cancel_at_home(self, request_id: str, reason: Reason) -> CancelAnswer:
        answer = await self._registry.cancel_live(request_id, reason)
        if answer is not None:
            return answer
        owner = self.entries.live.get(request_id)
        if owner is not None and owner != self.slot:
            try:
                reply = await self._forward(owner, Op.CANCEL_OWNED, request_id, reason)
            except SiblingUnreachable:
                # The owner died: its calls ended with it.
                self.entries.release(request_id, owner, 0)
                return CancelAnswer(request_id, CancelState.FINISHED, None, 0)
            return _answer_of(reply, request_id)
        tokens = self.entries.ended.get(request_id)
        if tokens is not None:
            return CancelAnswer(request_id, CancelState.FINISHED, None, tokens)
        finished = self._registry.finished(request_id)
        if finished is not None:
            return finished
        self.entries.tombstones.put(request_id, reason)
        raise not_found(request_id)

    async def _cancel_owned(self, request_id: str, reason: Reason) -> CancelAnswer:
        answer = await self._registry.cancel_live(request_id, reason)
        answer = answer or self._registry.finished(request_id)
        if answer is None:
            raise not_found(request_id)
        return answer

    async def _cancel_everywhere(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The home is unreachable: ask every sibling; the one running the id cancels it."""
        fields = {"id": request_id, "reason": reason.value}
        replies = await self._channel.ask_all(Op.CANCEL_OWNED, fields, CANCEL_WAIT)
        answers = [_answer_of(r, request_id) for r in replies.answered.values() if "answer" in r]
        here = self._registry.finished(request_id)
        if here is not None:
            answers.append(here)
        if answers:  # a cancelled one first: only one process can have run it
            return min(answers, key=lambda a: a.state is not CancelState.CANCELLED)
        self._registry.leave_tombstone(request_id, reason)
        raise not_found(request_id)

    async def _forward(self, slot: int, op: Op, request_id: str, reason: Reason) -> Message:
        """Ask sibling ``slot`` to cancel, timed (one hop). Raises SiblingUnreachable."""
        started = time.perf_counter()
        try:
            fields = {"id": request_id, "reason": reason.value}
            return await self._channel.ask(slot, op, fields, CANCEL_WAIT)
        finally:
            self._metrics.cancel_forward.observe(time.perf_counter() - started)

    # -- a sibling's questions -------------------------------------------------------------

    def _on_hello(self, message: Message) -> Message:
        slot = integer(message, "slot")
        self.entries.forget(slot)
        return {"live": [i for i in self._registry.held_ids() if self.home(i) == slot]}

    def _on_claim(self, message: Message) -> Message:
        try:
            self.entries.claim(text(message, "id"), integer(message, "owner"))
        except DuplicateRequestId:
            return {"error": "duplicate"}
        except CancelledBeforeArrival as exc:
            return {"error": "cancelled", "reason": exc.reason.value}
        return {"ok": True}

    def _on_release(self, message: Message) -> Message:
        tokens = integer(message, "tokens")
        self.entries.release(text(message, "id"), integer(message, "owner"), tokens)
        return {}

    async def _on_cancel_group(self, message: Message) -> Message:
        group, reason = text(message, "group"), Reason.parse(text(message, "reason"))
        if not request_ids.is_valid(group):
            raise ValueError("a group must keep the id rule")
        return {"answers": [a.to_json() for a in await self._registry.cancel_group(group, reason)]}

    async def _on_cancel(self, message: Message) -> Message:
        reason = Reason.parse(text(message, "reason"))
        act = self._cancel_at_home if message["op"] == Op.CANCEL else self._cancel_owned
        try:
            answer = await act(text(message, "id"), reason)
        except RequestNotFound:
            return {"error": "not_found"}
        except Exception as exc:  # an engine failing its abort: the caller answers 500
            return {"error": str(exc) or type(exc).__name__}
        return {"answer": answer.to_json()}


def _answer_of(reply: Message, request_id: str) -> CancelAnswer:
    if "answer" in reply:
        return CancelAnswer.from_json(json.dumps(reply["answer"]))
    if reply.get("error") == "not_found":
        raise not_found(request_id)
    error = reply.get("error")
    raise GatewayError(f"the API process running {request_id!r} failed the cancel: {error}")
