"""The two legs of an engine request served split, as a cancel and ``GET /v2/requests`` see them.

An engine request of a disaggregated pool is placed :class:`~.split.Split`, whose ``legs`` are a
:class:`Legs`: the prefill leg's and the decode leg's engine request (each on its worker), and
the key the prompt's KV is kept under between them (the engine request's id,
``<call id>-<n>``).

:meth:`Legs.abort` is what every cancel runs (the cancel API, a hang-up, a deadline, shutdown):
abort whichever legs run, then release the key's KV on the prefill engine, and return once
each engine confirmed. It is idempotent, and after it the decode leg never starts (the runner
checks the cancel before starting it). :meth:`Legs.answer` says per leg what was freed.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from gateway_server.engine.handoff import DisaggregatedEngine, WorkerRole
from hangup_contract.cancel_labels import Phase

if TYPE_CHECKING:
    from gateway_server.engine.pool import Worker


class LegState(enum.StrEnum):
    """Where a leg is, as ``GET /v2/requests`` and the cancel answer's ``legs`` say."""

    PENDING = "pending"
    """Not started (a decode leg before the handoff)."""
    RUNNING = "running"
    ENDED = "ended"
    ABORTED = "aborted"
    NEVER_STARTED = "never_started"
    """Cancelled before it started: nothing ran, nothing was allocated."""


@dataclass(eq=False)
class Leg:
    role: WorkerRole
    request_id: str
    worker: Worker | None = None
    engine: DisaggregatedEngine | None = None
    state: LegState = LegState.PENDING
    freed_blocks: int = 0
    worker_released: bool = False
    """The router's count for its worker was given back (the runner does it once)."""

    def bind(self, worker: Worker) -> None:
        """The leg runs on ``worker`` (its current engine: kept, should the worker restart)."""
        self.worker = worker
        self.engine = cast(DisaggregatedEngine, worker.engine)
        self.state = LegState.RUNNING

    def describe(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "worker": self.worker.name if self.worker is not None else None,
            "engine_request_id": self.request_id,
            "state": self.state.value,
        }

    async def abort(self) -> None:
        """Abort the leg if it runs; count the blocks it held as freed."""
        if self.engine is None:
            self.state = LegState.NEVER_STARTED
            return
        if self.state is not LegState.RUNNING:
            return
        self.freed_blocks += self.engine.kv_blocks(self.request_id)
        await self.engine.abort(self.request_id)
        self.state = LegState.ABORTED


@dataclass(eq=False)
class Legs:
    key: str
    """What the prompt's KV is kept under between the legs."""
    prefill: Leg = field(init=False)
    decode: Leg = field(init=False)
    prefilled: bool = False
    """The prefill leg ended with its KV held: the request is in transfer or beyond."""
    released: bool = False
    """The key's KV has been released on the prefill engine."""
    _aborting: asyncio.Future[None] | None = None
    _releasing: asyncio.Future[int] | None = None
    _held_phase: Phase | None = None

    def __post_init__(self) -> None:
        self.prefill = Leg(WorkerRole.PREFILL, f"{self.key}-prefill")
        self.decode = Leg(WorkerRole.DECODE, f"{self.key}-decode")

    def phase(self, started_decode: bool) -> Phase:
        """The request's phase: the prefill leg's, then ``transfer`` until the decode engine
        has the KV and admitted the request, then ``decode`` (or what :meth:`hold_phase`
        kept)."""
        if self._held_phase is not None:
            return self._held_phase
        decode = self.decode
        if decode.state is LegState.ENDED:  # generated all it will (the KV release may follow)
            return Phase.DECODE
        if decode.engine is not None and decode.state is LegState.RUNNING:
            seen = decode.engine.phase(decode.request_id)
            if seen in (Phase.DECODE, Phase.PREFILL):  # PREFILL: the KV was lost, recomputed
                return seen
            return Phase.DECODE if seen is None and started_decode else Phase.TRANSFER
        if self.prefilled:
            return Phase.TRANSFER
        prefill = self.prefill
        if prefill.engine is not None and prefill.state is LegState.RUNNING:
            return prefill.engine.phase(prefill.request_id) or Phase.QUEUED
        return Phase.QUEUED

    def hold_phase(self, started_decode: bool) -> None:
        """From now on, the phase is the one the request is in now. For a request whose consumer
        left: its teardown awaits (the KV released) while the engines drop its legs, after
        which a hang-up in prefill would read as one in the queue."""
        if self._held_phase is None:
            self._held_phase = self.phase(started_decode)

    @property
    def holds_handoff(self) -> bool:
        """A handoff in flight: the prefill side holds the KV, the decode side has not admitted
        the request yet (``transfer``)."""
        in_transfer = self.phase(started_decode=False) is Phase.TRANSFER
        return self.prefilled and not self.released and in_transfer

    async def abort(self) -> None:
        """Abort both legs (those running), then release the KV. Idempotent: a second caller
        (a hang-up racing the proxy's cancel) waits for the first one's abort to complete."""
        if self._aborting is None:
            self._aborting = asyncio.ensure_future(self._abort())
        await asyncio.shield(self._aborting)

    async def _abort(self) -> None:
        await asyncio.gather(self.prefill.abort(), self.decode.abort())
        await self.release()
        engine = self.prefill.engine
        if engine is not None:
            # The runner may have released already, before the prefill engine applied the abort
            # (vLLM's front end ends an aborted stream at once; its core applies the abort after
            # the step it is running, which may be the one that writes the KV): now that both
            # engines confirmed, what such a step wrote goes too.
            self.prefill.freed_blocks += await engine.release(self.key)

    async def release(self) -> int:
        """Free the key's KV on the prefill engine (once; later calls wait for the first)."""
        if self.prefill.engine is None:
            self.released = True
            return 0
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self.prefill.engine.release(self.key))
        freed = await asyncio.shield(self._releasing)
        if not self.released:
            self.released = True
            self.prefill.freed_blocks += freed
        return freed

    def answer(self) -> dict[str, dict[str, object]]:
        """What the cancel answer's ``legs`` says: each leg and the KV blocks it freed."""
        return {
            leg.role.value: {**leg.describe(), "kv_blocks_freed": leg.freed_blocks}
            for leg in (self.prefill, self.decode)
        }


def merge_answers(answers: list[dict[str, dict[str, object]]]) -> dict[str, dict[str, object]]:
    """One ``legs`` for a call of several engine requests: blocks summed, the rest listed."""
    if len(answers) == 1:
        return answers[0]
    merged: dict[str, dict[str, object]] = {}
    for role in ("prefill", "decode"):
        legs = [answer[role] for answer in answers]
        merged[role] = {
            "worker": [leg["worker"] for leg in legs],
            "engine_request_id": [leg["engine_request_id"] for leg in legs],
            "state": [leg["state"] for leg in legs],
            "kv_blocks_freed": sum(cast(int, leg["kv_blocks_freed"]) for leg in legs),
        }
    return merged
