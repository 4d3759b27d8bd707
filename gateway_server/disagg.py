"""Disaggregated prefill/decode: one engine request run as a prefill leg and a decode leg.

:func:`run_legs` is what :meth:`GenerationService.generate` streams from when the pool has
roles (``--worker-roles``); everything else (books, metrics, cancels, hang-ups) stays the
service's and the registry's, on one :class:`~gateway_server.registry.EngineCall` whose
``legs`` (:mod:`gateway_server.legs`) name both engine requests. In order:

1. ``queued``/``prefill``: the prefill leg runs on the prefill worker the service acquired
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
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from gateway_server.engine.base import EngineRequest, FinishReason, SamplingParams, TokenChunk
from gateway_server.engine.handoff import KvHandoff, WorkerRole
from gateway_server.engine.pool import EnginePool, Worker
from gateway_server.legs import Leg, Legs, LegState

if TYPE_CHECKING:
    from gateway_server.registry import EngineCall


async def run_legs(
    pool: EnginePool, request: EngineCall, prompt: str | tuple[int, ...], params: SamplingParams
) -> AsyncGenerator[TokenChunk, None]:
    """Chunks of ``request`` (its ``legs`` set, the prefill leg bound to an acquired worker),
    as ``Engine.generate`` yields them: a cancel ends it with an ``ABORT`` chunk.

    Raises EngineError when an engine fails a leg, NoLiveWorker when no decode worker lives."""
    legs = request.legs
    assert legs is not None and legs.prefill.engine is not None
    prefill, engine = legs.prefill, legs.prefill.engine
    try:
        try:
            handoff = await engine.prefill(
                EngineRequest(prefill.request_id, prompt, params), legs.key
            )
        finally:
            _give_back(pool, prefill)
        if handoff is None or request.cancel_reason is not None:
            yield _aborted(prompt, handoff)
            return
        legs.prefilled = True
        prefill.state = LegState.ENDED
        worker = pool.acquire(WorkerRole.DECODE)
        legs.decode.bind(worker)
        request.worker = worker  # errors from here on name the decode worker
        try:
            stream = legs.decode.engine.decode(  # type: ignore[union-attr]
                EngineRequest(legs.decode.request_id, prompt, params), handoff
            )
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    yield chunk
            if legs.decode.state is LegState.RUNNING:
                legs.decode.state = LegState.ENDED
        finally:
            _give_back(pool, legs.decode)
    except (asyncio.CancelledError, GeneratorExit):  # a hang-up, or the service closed it
        legs.hold_phase(request.started_decode)  # what the service records, after the awaits
        raise
    finally:
        if not legs.released:  # a cancel released it already: nothing to wait for
            await asyncio.shield(legs.release())


def give_back_workers(pool: EnginePool, legs: Legs) -> None:
    """Both legs' workers back to the router's count, those not given back yet (idempotent)."""
    _give_back(pool, legs.prefill)
    _give_back(pool, legs.decode)


def _give_back(pool: EnginePool, leg: Leg) -> None:
    """The leg's worker goes back to the router's count (once)."""
    worker: Worker | None = leg.worker
    if worker is not None and not leg.worker_released:
        leg.worker_released = True
        pool.release(worker)


def _aborted(prompt: str | tuple[int, ...], handoff: KvHandoff | None) -> TokenChunk:
    """The chunk a call aborted before its decode leg ends with. Its prompt tokens are the
    prefill's count when it finished, else 0 for a text prompt (not counted again: tokenizing a
    long prompt a second time would hold the event loop, and every other call, for milliseconds
    per cancel; ten hung-up 7,400-token prompts held a short call's arrival for about 0.1 s,
    ``bench.pd_hol``)."""
    if handoff is not None:
        tokens = handoff.prompt_tokens
    else:
        tokens = len(prompt) if isinstance(prompt, tuple) else 0
    return TokenChunk("", 0, tokens, FinishReason.ABORT)
