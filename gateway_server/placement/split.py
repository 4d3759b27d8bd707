"""An engine request split (disaggregated prefill/decode): a prefill leg and a decode leg.

:class:`SplitPlacer` places every request of a pool whose workers have roles
(``--worker-roles``); everything else (books, metrics, cancels, hang-ups) stays the service's
and the registry's, through the :class:`~.base.Placement` a :class:`Split` implements, whose
:class:`~.legs.Legs` name both legs' engine requests. In order:

1. ``queued``/``prefill``: the prefill leg runs on the prefill worker placed on
   (``prefill(request, key)``); that worker is given back to the router once it ends.
2. ``transfer``: unless the request was cancelled meanwhile (then the decode leg never starts:
   a cancel that came before the call did is refused at its arrival, which covers both legs),
   the least-loaded decode worker gets ``decode(request, handoff)``; its engine loads the KV.
3. ``decode``: its chunks are relayed as they come.

Whatever ends it (completion, a cancel, a hang-up, a failure of either engine), the key's KV is
released on the prefill engine before the request is over (:meth:`Legs.release`, idempotent):
no notification, lease or decode leg is trusted to do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator

from gateway_server.engine.base import (
    Consumption,
    EngineRequest,
    FinishReason,
    SamplingParams,
    TokenChunk,
)
from gateway_server.engine.handoff import KvHandoff, WorkerRole
from gateway_server.engine.pool import EnginePool, Worker
from gateway_server.placement.base import Progress
from gateway_server.placement.legs import Leg, Legs, LegState
from hangup_contract.cancel_labels import Phase


class Split:
    """Implements :class:`~.base.Placement` as two legs, the prefill leg placed first."""

    joins_cancels = True
    frees_kv = True

    def __init__(self, pool: EnginePool, worker: Worker, request_id: str) -> None:
        self.request_id = request_id
        self.legs = Legs(request_id)
        self.legs.prefill.bind(worker)
        self._pool = pool
        self._worker = worker

    @property
    def worker(self) -> Worker:
        return self._worker

    async def run(
        self, prompt: str | tuple[int, ...], params: SamplingParams, progress: Progress
    ) -> AsyncGenerator[TokenChunk, None]:
        legs, pool = self.legs, self._pool
        prefill, engine = legs.prefill, legs.prefill.engine
        assert engine is not None
        share, consumption = progress.share, progress.consumption
        try:
            try:
                handoff = await engine.prefill(
                    EngineRequest(prefill.request_id, prompt, params, share, consumption),
                    legs.key,
                )
            finally:
                _give_back(pool, prefill)
            if handoff is None or progress.cancel_reason is not None:
                yield _aborted(prompt, handoff, consumption)
                return
            consumption.prefilled_at = time.perf_counter()
            legs.prefilled = True
            prefill.state = LegState.ENDED
            worker = pool.acquire(WorkerRole.DECODE)
            legs.decode.bind(worker)
            self._worker = worker  # errors from here on name the decode worker
            decode = legs.decode.engine
            assert decode is not None
            try:
                stream = decode.decode(
                    EngineRequest(legs.decode.request_id, prompt, params, share, consumption),
                    handoff,
                )
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        yield chunk
                if legs.decode.state is LegState.RUNNING:
                    legs.decode.state = LegState.ENDED
            finally:
                _give_back(pool, legs.decode)
        except (asyncio.CancelledError, GeneratorExit):  # a hang-up, or the service closed it
            legs.hold_phase(progress.started_decode)  # what the service records, after awaits
            raise
        finally:
            if not legs.released:  # a cancel released it already: nothing to wait for
                await asyncio.shield(legs.release())

    def give_back(self) -> None:
        _give_back(self._pool, self.legs.prefill)
        _give_back(self._pool, self.legs.decode)

    async def abort(self) -> None:
        await self.legs.abort()

    def phase(self, started_decode: bool) -> Phase:
        return self.legs.phase(started_decode)

    @property
    def holds_handoff(self) -> bool:
        return self.legs.holds_handoff

    def answer(self) -> dict[str, dict[str, object]]:
        return self.legs.answer()

    def describe(self) -> list[dict[str, object]]:
        return [leg.describe() for leg in (self.legs.prefill, self.legs.decode)]


class SplitPlacer:
    """Every request's prefill leg on the least-loaded live worker that prefills."""

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool

    def place(self, request_id: str) -> Split:
        return Split(self._pool, self._pool.acquire(WorkerRole.PREFILL), request_id)


def _give_back(pool: EnginePool, leg: Leg) -> None:
    """The leg's worker goes back to the router's count (once)."""
    worker: Worker | None = leg.worker
    if worker is not None and not leg.worker_released:
        leg.worker_released = True
        pool.release(worker)


def _aborted(
    prompt: str | tuple[int, ...], handoff: KvHandoff | None, consumption: Consumption
) -> TokenChunk:
    """The chunk a call aborted before its decode leg ends with. Its prompt tokens are the
    prefill's count when it finished, else what the prefill engine counted so far, else 0 for a
    text prompt (not counted again: tokenizing a long prompt a second time would hold the event
    loop, and every other call, for milliseconds per cancel; ten hung-up 7,400-token prompts
    held a short call's arrival for about 0.1 s, ``bench.pd.hol``)."""
    if handoff is not None:
        tokens = handoff.prompt_tokens
    elif consumption.prompt_tokens:
        tokens = consumption.prompt_tokens
    else:
        tokens = len(prompt) if isinstance(prompt, tuple) else 0
    return TokenChunk("", 0, tokens, FinishReason.ABORT)
