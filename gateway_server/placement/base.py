"""The placement seam: what the service and the registry call, whatever the placement."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from gateway_server.engine.base import Consumption, SamplingParams, Share, TokenChunk
from gateway_server.engine.pool import Worker
from hangup_contract.cancel_labels import Phase, Reason


class Progress(Protocol):
    """What a placement's runner reads of its engine request as it runs."""

    @property
    def cancel_reason(self) -> Reason | None: ...

    @property
    def started_decode(self) -> bool: ...

    @property
    def share(self) -> Share:
        """Whose turn it waits for in an engine's admission queue."""
        ...

    @property
    def consumption(self) -> Consumption:
        """Where its engines write what it consumed (both legs of a split request)."""
        ...


class Placement(Protocol):
    """One engine request's place: where it runs, how it is stopped, what a cancel says of it."""

    request_id: str

    @property
    def worker(self) -> Worker:
        """The worker an engine failure is named by: the one running now."""
        ...

    def run(
        self, prompt: str | tuple[int, ...], params: SamplingParams, progress: Progress
    ) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks as ``Engine.generate`` yields them (a cancel ends them with an
        ``ABORT`` chunk). Raises EngineError when an engine fails it, NoLiveWorker when no
        worker can take a later part."""
        ...

    def give_back(self) -> None:
        """Its workers back to the router's count, those not given back yet (idempotent)."""
        ...

    async def abort(self) -> None:
        """Abort it wherever it runs and free what it holds; return once every engine
        confirmed. Idempotent."""
        ...

    def phase(self, started_decode: bool) -> Phase:
        """Where it is now."""
        ...

    @property
    def joins_cancels(self) -> bool:
        """A second cancel waits for the first one's abort (it frees more than one engine's)."""
        ...

    @property
    def frees_kv(self) -> bool:
        """An abort frees KV held between engines (counted as ``cancel_to_freed``)."""
        ...

    @property
    def holds_handoff(self) -> bool:
        """Its prompt's KV is held for a decode worker now (``transfer``)."""
        ...

    def answer(self) -> dict[str, dict[str, object]] | None:
        """What a cancel answer's ``legs`` says of it; None for a request run whole."""
        ...

    def describe(self) -> list[dict[str, object]]:
        """Its legs as ``GET /v2/requests`` lists them; empty for a request run whole."""
        ...


class Placer(Protocol):
    """The placement strategy: a new engine request's place."""

    def place(self, request_id: str) -> Placement:
        """Acquire the worker it starts on. Raises NoLiveWorker when none can take it."""
        ...
