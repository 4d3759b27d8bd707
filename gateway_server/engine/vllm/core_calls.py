"""Calls to a vLLM engine core that are answered between model steps, and what their answers
prove about a request.

The engine core reads its input queue in order and only between steps. A cheap utility call
(``is_sleeping``) sent after a message is therefore answered only once that message has been
handled:

- after ``AsyncLLM.abort``: the core has applied the abort, freeing the request's batch slot and
  KV-cache blocks (:func:`abort_applied`; the moment ``cancel_to_abort_seconds`` measures);
- after ``AsyncLLM.add_request``: the core holds the request, so scheduler statistics received
  later count it (:func:`note_held`; how the engine tells ``queued`` from ``prefill``).

A core that is killed leaves the calls made to it unanswered; :func:`answered_or_dead` returns
once the core is seen dead instead, and every wait is bounded by ``ABORT_CONFIRM_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

from gateway_server.engine.vllm.outputs import Live
from gateway_server.engine.vllm.stats import SchedulerSnapshot
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway.vllm")

ABORT_CONFIRM_TIMEOUT_S = 30.0
"""How long an abort waits for the engine core's confirmation before giving up (logged)."""
DEATH_POLL_S = 0.05
"""How often a call waiting on the engine core looks whether the core has died."""


async def note_held(llm: Any, state: Live, stats: SchedulerSnapshot) -> None:
    """Note the step after which the engine core holds the request (``state.seen_after``).
    Runs beside the stream; a failure only leaves the phase at ``queued`` until the first token
    (the stream reports engine failures itself)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(ABORT_CONFIRM_TIMEOUT_S):
            await llm.is_sleeping()
            state.seen_after = stats.steps


async def abort_applied(llm: Any, request_id: str, state: Live, worker: int) -> None:
    """Abort ``request_id`` and return once the engine core has applied it, or is dead, or the
    confirmation timed out (logged: a hung core must not hang cancel callers with it)."""
    try:
        async with asyncio.timeout(ABORT_CONFIRM_TIMEOUT_S):
            await state.registered.wait()
            # A dead engine core works on nothing: there is nothing left to stop.
            with contextlib.suppress(Exception):
                await llm.abort(request_id)
                await answered_or_dead(llm, llm.is_sleeping())  # queued after the abort
    except TimeoutError:
        log_event(
            log,
            "vllm_abort_unconfirmed",
            logging.ERROR,
            worker=worker,
            request_id=request_id,
            timeout_s=ABORT_CONFIRM_TIMEOUT_S,
        )


async def answered_or_dead(llm: Any, call: Awaitable[object]) -> None:
    """Await a call to the engine core; return once the core is seen dead instead (vLLM leaves
    the calls a core was killed under unanswered: a cancel that came just before vLLM noticed
    the death waited the whole confirmation timeout)."""
    answer = asyncio.ensure_future(call)
    try:
        while not answer.done() and not llm.errored:
            await asyncio.wait([answer], timeout=DEATH_POLL_S)
    finally:
        if not answer.done():
            answer.cancel()
        await asyncio.gather(answer, return_exceptions=True)
