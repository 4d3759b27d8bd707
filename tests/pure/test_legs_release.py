"""A cancel of a disaggregated request frees the handoff KV even when the prefill leg wrote it
after the runner's own release: vLLM's front end ends an aborted stream at once (the runner then
releases the handoff), while its engine core applies the abort only after the step it is
running, which may be the step that writes the prompt's KV. The cancel answers once the engines
confirmed, and by then that KV is gone too."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from bench.base.waiting import run_ready_callbacks
from gateway_server.placement.legs import Legs, LegState


class AbortAppliedLater:
    """A prefill engine whose abort is applied when the test says (at its next step boundary),
    holding ``written`` blocks for the handoff until they are released."""

    def __init__(self) -> None:
        self.applied = asyncio.Event()
        self.written = 0

    async def abort(self, request_id: str) -> None:
        await self.applied.wait()

    async def release(self, key: str) -> int:
        freed, self.written = self.written, 0
        return freed

    def kv_blocks(self, request_id: str) -> int:
        return 0


async def test_kv_written_by_the_step_the_abort_waited_for_is_freed_by_the_cancel() -> None:
    engine = AbortAppliedLater()
    legs = Legs("c1-1")
    legs.prefill.bind(SimpleNamespace(engine=engine, name="0"))  # type: ignore[arg-type]
    cancel = asyncio.ensure_future(legs.abort())
    await run_ready_callbacks()
    assert await legs.release() == 0, "the runner's release: nothing written yet"
    engine.written = 3  # the step that was running when the abort came ends, writing the KV
    assert not cancel.done(), "the cancel answered before the engine applied the abort"
    engine.applied.set()
    await asyncio.wait_for(cancel, timeout=5)
    assert engine.written == 0, "the KV the last prefill step wrote outlived the cancel"
    assert legs.prefill.freed_blocks == 3 and legs.prefill.state is LegState.ABORTED
