"""Generation: what every protocol handler calls to run engine requests for a call.

A handler opens a call (``async with service.call(...)``), then iterates
``service.generate(call, prompt, params)`` once per engine request, inside
``contextlib.aclosing``. The service routes the request to a worker, relays the engine's chunks,
and keeps the books: tokens, phase, time to first token, and, when the request ends, one
outcome (metrics and one log line).

How a request is cancelled, whichever way:

- cancel API or shutdown: ``CallRegistry.cancel`` records the reason and aborts on the engine;
  the engine's stream ends with ``ABORT`` and ``generate`` raises :class:`RequestCancelled`.
- the client went away: the handler task is cancelled (or the generator closed) while inside
  ``generate``; it aborts the request with ``call.hangup_reason`` (shielded, awaited) and
  re-raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from gateway_server.engine.base import (
    Engine,
    EngineError,
    EngineRequest,
    FinishReason,
    NoChatTemplate,
    RequestRejected,
    SamplingParams,
    TokenChunk,
)
from gateway_server.engine.pool import EnginePool
from gateway_server.errors import (
    CancelledBeforeArrival,
    EngineFailure,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    RequestCancelled,
    Unavailable,
)
from gateway_server.metrics import GatewayMetrics, WorkerLoad
from gateway_server.registry import Call, CallRegistry, EngineCall
from gateway_server.tool_calls import ToolCalling, ToolSettings
from gateway_server.vocabulary import Outcome, Protocol
from hangup_contract.cancel import CancelAnswer
from hangup_contract.runtime.logs import log_event
from hangup_contract.vocabulary import Phase, Reason

if TYPE_CHECKING:
    from gateway_server.siblings import Siblings

log = logging.getLogger("hangup.gateway")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int


class GenerationService:
    def __init__(
        self, pool: EnginePool, registry: CallRegistry, metrics: GatewayMetrics, model: ModelInfo
    ) -> None:
        self.pool = pool
        self.registry = registry
        self.metrics = metrics
        self.model = model
        self.draining = False
        self.siblings: Siblings | None = None
        """Set with ``--api-processes`` > 1: ids are claimed and cancelled gateway-wide."""
        self.tools: ToolCalling = ToolCalling(ToolSettings(), None)
        """How ``tools`` are handled (``--tool-call-parser``); set once the engines run."""
        # Every call runs the one served model (``call`` checks it): the per-token series are
        # bound once, as a labels() lookup costs more than the update it leads to.
        self._tokens = metrics.generated_tokens.labels(model.name)
        self._first_token = metrics.time_to_first_token.labels(model.name)
        self._inter_token = metrics.inter_token_latency.labels(model.name)

    # -- calls -----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Taking new requests: a worker is alive and the gateway is not draining."""
        return self.pool.ready and not self.draining

    def check_model(self, name: str) -> None:
        if name != self.model.name:
            raise ModelNotFound(
                f"model {name!r} is not served here; this gateway serves {self.model.name!r}"
            )

    @asynccontextmanager
    async def call(self, call_id: str, model: str, protocol: Protocol) -> AsyncIterator[Call]:
        """Open a call for the duration of the block.

        Raises ModelNotFound, Unavailable (draining), DuplicateRequestId, or
        CancelledBeforeArrival (counted as a cancellation in the queued phase).
        """
        self.check_model(model)
        if self.draining:
            raise Unavailable("the gateway is shutting down")
        try:
            call = self.registry.open(call_id, model, protocol)
            if self.siblings is not None:
                await self._claim(call_id, partial(self.registry.close, call, remember=False))
        except CancelledBeforeArrival as exc:
            self.metrics.requests.labels(model, protocol.value, Outcome.CANCELLED.value).inc()
            self.metrics.cancellations.labels(model, exc.reason.value, Phase.QUEUED.value).inc()
            _log_end(
                call_id,
                call_id,
                model,
                protocol,
                Outcome.CANCELLED,
                exc.reason,
                Phase.QUEUED,
                0,
                0,
                0.0,
            )
            raise
        try:
            yield call
        finally:
            self.registry.close(call)
            if self.siblings is not None:
                self.siblings.release(call_id, call.generated_tokens)

    async def _claim(self, request_id: str, undo: Callable[[], None]) -> None:
        """Claim an id opened here across the API processes; ``undo`` the local open when
        refused (a duplicate elsewhere, or a cancel that came first)."""
        assert self.siblings is not None
        try:
            await self.siblings.claim(request_id)
        except GatewayError:
            undo()
            raise

    def check_prompt(self, prompt: str, params: SamplingParams) -> None:
        """Raise InvalidRequest when ``prompt`` plus ``max_tokens`` exceeds the context length."""
        tokens = self._engine().count_prompt_tokens(prompt)
        limit = self.model.max_model_len
        if tokens + params.max_tokens > limit:
            raise InvalidRequest(
                f"prompt ({tokens} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"model's context length of {limit} tokens",
                param="prompt",
            )

    def chat_prompt(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The model's prompt for a chat (with ``tools`` for the template, when given).

        Raises InvalidRequest when the model has no chat template or the engine does no tools.
        """
        try:
            return self._engine().apply_chat_template(messages, tools)
        except NoChatTemplate as exc:
            raise InvalidRequest(str(exc)) from exc
        except RequestRejected as exc:
            raise InvalidRequest(str(exc), param="tools") from exc

    def check_params(self, params: SamplingParams) -> None:
        """Raise InvalidRequest when the engine cannot honour ``params`` (see ``Engine.check``)."""
        try:
            self._engine().check(params)
        except RequestRejected as exc:
            source = params.structured.source if params.structured else None
            raise InvalidRequest(str(exc), param=source) from exc

    def _engine(self) -> Engine:
        """The engine whose tokenizer speaks for every worker's (they serve one model)."""
        return self.pool.workers[0].engine

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        """Cancel a call, or one request by its alias (see ``CallRegistry.cancel``).

        Shielded: a cancel caller that hangs up must not leave an abort half done.
        """
        if self.siblings is not None:
            return await asyncio.shield(self.siblings.cancel(request_id, reason))
        return await asyncio.shield(self.registry.cancel(request_id, reason))

    async def all_calls(self) -> list[dict[str, object]]:
        """Every call in flight in the gateway (each API process's, with ``--api-processes``)."""
        if self.siblings is not None:
            return await self.siblings.all_calls()
        return self.describe_calls()

    def record_rejected(self, model: str | None, protocol: Protocol) -> None:
        """Count a request refused before it ran (bad input, unknown model, duplicate id)."""
        label = model if model == self.model.name else "unknown"
        self.metrics.requests.labels(label, protocol.value, Outcome.REJECTED.value).inc()

    # -- engine requests -------------------------------------------------------------------

    async def generate(
        self, call: Call, prompt: str, params: SamplingParams, *, alias: str | None = None
    ) -> AsyncGenerator[TokenChunk, None]:
        """Run one engine request for ``call``; yield its chunks (the last has a finish reason).

        Raises RequestCancelled when it was cancelled (by id, call or shutdown), EngineFailure
        when the engine failed it, Unavailable when no worker is alive. Use inside
        ``contextlib.aclosing`` so an early exit aborts the engine request at once.
        """
        if call.cancel_reason is not None:
            raise RequestCancelled(call.cancel_reason)
        worker = self.pool.acquire()
        request = EngineCall(call.next_engine_request_id(), worker, alias)
        try:
            self.registry.attach(call, request)
            if alias is not None and self.siblings is not None:
                undo = partial(self.registry.detach, call, request, remember=False)
                await self._claim(alias, undo)
        except GatewayError:
            self.pool.release(worker)
            raise
        book = _Books(time.perf_counter())
        stream = worker.engine.generate(EngineRequest(request.engine_request_id, prompt, params))
        try:
            async for chunk in stream:
                book.prompt_tokens = chunk.prompt_tokens
                if chunk.finish_reason is FinishReason.ABORT:
                    raise RequestCancelled(request.cancel_reason or Reason.SHUTDOWN)
                if chunk.new_tokens:
                    self._count_tokens(call, request, book, chunk.new_tokens)
                yield chunk
            book.outcome = Outcome.COMPLETED
        except RequestCancelled:
            book.outcome = Outcome.CANCELLED
            raise
        except (asyncio.CancelledError, GeneratorExit):
            book.outcome = Outcome.CANCELLED
            abort = self.registry.abort_requests(call, [request], call.hangup_reason)
            await asyncio.shield(abort)
            raise
        except EngineError as exc:
            raise EngineFailure(f"engine worker {worker.name} failed the request: {exc}") from exc
        finally:
            await stream.aclose()
            self.pool.release(worker)
            self.registry.detach(call, request)
            if alias is not None and self.siblings is not None:
                self.siblings.release(alias, request.generated_tokens)
            self._record_end(call, request, book)

    def _count_tokens(self, call: Call, request: EngineCall, book: _Books, n: int) -> None:
        now = time.perf_counter()
        if book.last_token_at is None:
            self._first_token.observe(now - book.started)
            request.started_decode = True
        else:
            self._inter_token.observe((now - book.last_token_at) / n)
        book.last_token_at = now
        request.generated_tokens += n
        call.generated_tokens += n
        self._tokens.inc(n)

    def _record_end(self, call: Call, request: EngineCall, book: _Books) -> None:
        m = self.metrics
        outcome = Outcome.CANCELLED if request.cancel_reason is not None else book.outcome
        m.requests.labels(call.model, call.protocol.value, outcome.value).inc()
        reason, phase = request.cancel_reason, request.cancel_phase
        if outcome is Outcome.CANCELLED:
            reason = reason or call.hangup_reason
            phase = phase or Phase.QUEUED
            m.cancellations.labels(call.model, reason.value, phase.value).inc()
            m.wasted_tokens.labels(call.model).inc(request.generated_tokens)
        duration = time.perf_counter() - book.started
        _log_end(
            request.alias or request.engine_request_id, call.call_id, call.model, call.protocol,
            outcome, reason, phase, book.prompt_tokens, request.generated_tokens, duration,
        )  # fmt: skip

    # -- reading ---------------------------------------------------------------------------

    def phases_in_flight(self) -> Iterator[tuple[str, Phase]]:
        for call in self.registry.calls():
            for request in list(call.requests.values()):
                yield call.model, request.phase()

    def worker_loads(self) -> Iterator[WorkerLoad]:
        for worker in self.pool.workers:
            load = worker.engine.load()
            yield WorkerLoad(
                worker.name, worker.engine.alive, load.running, load.waiting, load.kv_cache_usage,
                load.kv_cache_blocks, load.block_size,
            )  # fmt: skip

    def describe_calls(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [
            {
                "request_id": call.call_id,
                "model": call.model,
                "protocol": call.protocol.value,
                "phase": call.phase().value,
                "age_s": round(now - call.started, 3),
                "generated_tokens": call.generated_tokens,
                "engine_requests": len(call.requests),
                "cancelling": call.cancel_reason.value if call.cancel_reason else None,
            }
            for call in self.registry.calls()
        ]


@dataclass(slots=True)
class _Books:
    started: float
    last_token_at: float | None = None
    prompt_tokens: int = 0
    outcome: Outcome = Outcome.ERROR


def _log_end(
    request_id: str, call_id: str, model: str, protocol: Protocol, outcome: Outcome,
    reason: Reason | None, phase: Phase | None, prompt_tokens: int, generated: int,
    duration: float,
) -> None:  # fmt: skip
    log_event(
        log, "request_end", request_id=request_id, call_id=call_id, model=model,
        protocol=protocol.value, outcome=outcome.value,
        reason=reason.value if reason else None, phase=phase.value if phase else None,
        prompt_tokens=prompt_tokens, generated_tokens=generated,
        duration_s=round(duration, 6),
    )  # fmt: skip
