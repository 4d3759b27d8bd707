"""An engine request run whole: on one worker, from its queue to its last token."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from gateway_server.engine.base import Engine, EngineRequest, SamplingParams, TokenChunk
from gateway_server.engine.handoff import WorkerRole
from gateway_server.engine.pool import EnginePool, Worker
from gateway_server.placement.base import Progress
from hangup_contract.cancel_labels import Phase


class Whole:
    """Implements :class:`~.base.Placement` on the worker it was placed on."""

    joins_cancels = False
    frees_kv = False
    holds_handoff = False

    def __init__(self, pool: EnginePool, worker: Worker, request_id: str) -> None:
        self.request_id = request_id
        self._pool = pool
        self._worker = worker
        self._engine: Engine = worker.engine
        """Kept: the worker gets a new engine when this one dies."""
        self._given_back = False

    @property
    def worker(self) -> Worker:
        return self._worker

    def run(
        self, prompt: str | tuple[int, ...], params: SamplingParams, progress: Progress
    ) -> AsyncGenerator[TokenChunk, None]:
        request = EngineRequest(
            self.request_id, prompt, params, progress.share, progress.consumption
        )
        return self._engine.generate(request)

    def give_back(self) -> None:
        if not self._given_back:
            self._given_back = True
            self._pool.release(self._worker)

    async def abort(self) -> None:
        await self._engine.abort(self.request_id)

    def phase(self, started_decode: bool) -> Phase:
        seen = self._engine.phase(self.request_id)
        if seen is not None:
            return seen
        return Phase.DECODE if started_decode else Phase.QUEUED

    def answer(self) -> None:
        return None

    def describe(self) -> list[dict[str, object]]:
        return []


class WholePlacer:
    """Every request on the least-loaded live worker."""

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool

    def place(self, request_id: str) -> Whole:
        return Whole(self._pool, self._pool.acquire(WorkerRole.BOTH), request_id)
