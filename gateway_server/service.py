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
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway_server.books import Books, phase_seconds
from gateway_server.clients import ClientRule
from gateway_server.engine.base import (
    ChatOptions,
    Engine,
    EngineError,
    EngineRefused,
    FinishReason,
    NoChatTemplate,
    NoFaults,
    NoLiveWorker,
    RequestRejected,
    SamplingParams,
    Share,
    TokenChunk,
)
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.tools import ToolCalling, ToolPlan
from gateway_server.errors import (
    CancelledBeforeArrival,
    EngineFailure,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    RequestCancelled,
    RequestNotFound,
    Unavailable,
)
from gateway_server.labels import Outcome, Protocol
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.metrics.token_books import TokenBooks
from gateway_server.placement import placer_for
from gateway_server.registry import Call, CallRegistry, EngineCall
from gateway_server.siblings.scope import CallDirectory, LocalDirectory
from hangup_contract import jobs
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import Phase, Reason
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int


class GenerationService:
    def __init__(
        self,
        pool: EnginePool,
        registry: CallRegistry,
        metrics: GatewayMetrics,
        model: ModelInfo,
        directory: CallDirectory | None = None,
        *,
        tools: ToolCalling,
        liveness: Callable[[], str | None] | None = None,
        clients: ClientRule | None = None,
    ) -> None:
        """``directory``: where ids are claimed, cancelled and listed gateway-wide (default:
        this process is the gateway; see :mod:`gateway_server.siblings.scope`). ``tools``: how
        ``tools`` are read (the engine's, with ``--tool-call-parser``). ``liveness``: None
        while this process is live, else why not (``gateway_server.health``; default: live).
        ``clients``: who a call's client is (default: its peer address)."""
        self.pool = pool
        self.registry = registry
        self.metrics = metrics
        self.model = model
        self.directory = directory or LocalDirectory(registry)
        self.placer = placer_for(pool)
        """Where each engine request runs: chosen once, by the pool's worker roles."""
        self.draining = False
        self.liveness: Callable[[], str | None] = liveness or (lambda: None)
        self.tools = tools
        self.clients = clients or ClientRule()
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

    def fresh_call_id(self) -> str:
        """An id for a call that came without one (see ``CallDirectory.fresh_id``)."""
        return self.directory.fresh_id()

    def check_model(self, name: str) -> None:
        if name != self.model.name:
            raise ModelNotFound(
                f"model {name!r} is not served here; this gateway serves {self.model.name!r}"
            )

    @asynccontextmanager
    async def call(
        self,
        call_id: str,
        model: str,
        protocol: Protocol,
        client: str = "",
        group: str | None = None,
    ) -> AsyncIterator[Call]:
        """Open a call for the duration of the block; ``client``: who sent it
        (``gateway_server.clients``), whose turn its engine requests wait for; ``group``: the
        job it belongs to (``hangup_contract.jobs``), if any.

        Raises ModelNotFound, Unavailable (draining), DuplicateRequestId, TooManyRequests (a
        bound on groups), or CancelledBeforeArrival (counted as a cancellation in the queued
        phase).
        """
        self.check_model(model)
        if self.draining:
            raise Unavailable("the gateway is shutting down")
        try:
            call = self.registry.open(call_id, model, protocol, group)
            call.client = client
            await self._claim(call_id, partial(self.registry.close, call, remember=False))
        except CancelledBeforeArrival as exc:  # here or at the id's home
            self._cancelled_before_running(call_id, model, protocol, exc.reason)
            raise
        except asyncio.CancelledError:  # the client hung up while the id's home answered
            self._cancelled_before_running(call_id, model, protocol, call.hangup_reason)
            raise
        try:
            yield call
        finally:
            self.registry.close(call)
            self.directory.release(call_id, call.generated_tokens)

    async def _claim(self, request_id: str, undo: Callable[[], None]) -> None:
        """Claim an id opened here gateway-wide; ``undo`` the local open when refused (a
        duplicate elsewhere, or a cancel that came first) or when the caller is cancelled
        meanwhile (its client hung up): then the home may hold the claim, and is told the id
        ended, so neither this process nor the home keeps it in flight."""
        try:
            await self.directory.claim(request_id)
        except GatewayError:
            undo()
            raise
        except BaseException:
            undo()
            self.directory.release(request_id, 0)
            raise

    def _cancelled_before_running(
        self,
        call_id: str,
        model: str,
        protocol: Protocol,
        reason: Reason,
        request_id: str | None = None,
    ) -> None:
        """Count and log a call (or its request ``request_id``, an alias) that ended,
        cancelled, before it reached an engine."""
        self.metrics.requests.labels(model, protocol.value, Outcome.CANCELLED.value).inc()
        self.metrics.cancellations.labels(model, reason.value, Phase.QUEUED.value).inc()
        _log_end(request_id or call_id, call_id, model, protocol, Outcome.CANCELLED, reason,
                 Phase.QUEUED)  # fmt: skip

    def check_prompt(self, prompt: str | tuple[int, ...], params: SamplingParams) -> None:
        """Raise InvalidRequest when ``prompt`` plus ``max_tokens`` exceeds the context length."""
        tokens = self._engine().count_prompt_tokens(prompt)
        limit = self.model.max_model_len
        if tokens + params.max_tokens > limit:
            raise InvalidRequest(
                f"prompt ({tokens} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"model's context length of {limit} tokens",
                param="prompt",
            )

    def plan_tools(self, body: dict[str, Any]) -> ToolPlan | None:
        """What to do about a chat request's tools (None: it names none). Raises InvalidRequest
        naming the field."""
        try:
            return self.tools.plan(body)
        except RequestRejected as exc:
            raise InvalidRequest(str(exc), param=exc.param) from exc

    def chat_prompt(
        self, messages: list[dict[str, Any]], options: ChatOptions | None = None
    ) -> str:
        """The model's prompt for a chat. Raises InvalidRequest when it has no chat template or
        the template cannot apply."""
        try:
            return self._engine().apply_chat_template(messages, options or ChatOptions())
        except NoChatTemplate as exc:
            raise InvalidRequest(str(exc)) from exc
        except RequestRejected as exc:
            raise InvalidRequest(str(exc), param="tools") from exc
        except (ValueError, TypeError, LookupError) as exc:  # the template's own refusals
            message = f"the chat template cannot apply: {exc}"
            raise InvalidRequest(message, param="messages") from exc

    @property
    def engine(self) -> Engine:
        """The engine whose tokenizer and features speak for every worker's (one model)."""
        return self._engine()

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
        """Cancel a call, or one request by its alias (see ``CallRegistry.cancel``), or a call
        by its answer's own id (``chatcmpl-<call id>``, ``cmpl-<call id>``: what a streaming
        client saw first) when no call is known by that id itself.

        Shielded: a cancel caller that hangs up must not leave an abort half done.
        """
        return await asyncio.shield(self._cancel(request_id, reason))

    async def _cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        try:
            return await self.directory.cancel(request_id, reason)
        except RequestNotFound:
            call_id = jobs.call_id_of_answer_id(request_id)
            if call_id is None:
                raise
        answer = await self.directory.cancel(call_id, reason)
        return dataclasses.replace(answer, request_id=request_id)

    async def cancel_group(self, group: str, reason: Reason) -> list[dict[str, object]]:
        """Cancel every call of ``group`` in the gateway, and refuse its calls that arrive
        within the tombstone ttl; each call's answer (``CancelAnswer.to_json()``), once its
        engines confirmed. Shielded, as :meth:`cancel`."""
        return await asyncio.shield(self.directory.cancel_group(group, reason))

    async def all_calls(self) -> list[dict[str, object]]:
        """Every call in flight in the gateway (each API process's, with ``--api-processes``)."""
        return await self.directory.all_calls()

    def inject_fault(self, worker_name: str, fault: str) -> int:
        """Apply a simulated engine fault (``kill``, ``hang``, ``resume``) to a worker of this
        process; returns its index. Raises RequestNotFound for a worker this process does not
        run on the simulated engine, InvalidRequest for an unknown fault."""
        worker = next((w for w in self.pool.workers if w.name == worker_name), None)
        missing = RequestNotFound(f"no simulated engine worker {worker_name!r} in this process")
        if worker is None:
            raise missing
        try:
            worker.engine.inject_fault(fault)
        except NoFaults as exc:
            raise missing from exc
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="fault") from exc
        return worker.index

    def record_rejected(self, model: str | None, protocol: Protocol) -> None:
        """Count a request refused before it ran (bad input, unknown model, duplicate id)."""
        label = model if model == self.model.name else "unknown"
        self.metrics.requests.labels(label, protocol.value, Outcome.REJECTED.value).inc()

    # -- engine requests -------------------------------------------------------------------

    async def generate(
        self,
        call: Call,
        prompt: str | tuple[int, ...],
        params: SamplingParams,
        *,
        alias: str | None = None,
        bills_prompt: bool = True,
    ) -> AsyncGenerator[TokenChunk, None]:
        """Run one engine request for ``call``; yield its chunks (the last has a finish reason).
        ``bills_prompt``: its prompt counts in the call's usage (false for a prompt's choices
        after its first: OpenAI's usage counts each prompt once).

        Raises RequestCancelled when it was cancelled (by id, call or shutdown; its ``usage``
        says what the request consumed), EngineFailure when the engine failed it, Unavailable
        when no worker is alive. Use inside ``contextlib.aclosing`` so an early exit aborts the
        engine request at once. Once it has ended, however, ``call.usage`` counts it.
        """
        if call.cancel_reason is not None:
            raise RequestCancelled(call.cancel_reason)
        request_id = call.next_engine_request_id()
        try:
            placement = self.placer.place(request_id)
        except NoLiveWorker as exc:
            raise Unavailable(str(exc)) from exc
        share = Share(call.client, call.call_id)
        request = EngineCall(request_id, placement, alias, share, bills_prompt=bills_prompt)
        try:
            self.registry.attach(call, request)
            if alias is not None:
                undo = partial(self.registry.detach, call, request, remember=False)
                await self._claim(alias, undo)
        except asyncio.CancelledError:  # the client went away while the alias's home answered
            placement.give_back()
            reason = call.hangup_reason
            self._cancelled_before_running(call.call_id, call.model, call.protocol, reason, alias)
            raise
        except GatewayError:
            placement.give_back()
            raise
        started = time.perf_counter()
        book = Books(started, TokenBooks(self._tokens, self._inter_token, started))
        stream = placement.run(prompt, params, request)
        try:
            async for chunk in stream:
                book.prompt_tokens = chunk.prompt_tokens
                if chunk.finish_reason is FinishReason.ABORT:
                    raise RequestCancelled(request.cancel_reason or Reason.SHUTDOWN)
                if chunk.new_tokens:
                    self._count_tokens(call, request, book, chunk.new_tokens)
                yield chunk
            book.outcome = Outcome.COMPLETED
        except RequestCancelled as exc:
            book.outcome, book.cancelled = Outcome.CANCELLED, exc
            raise
        except (asyncio.CancelledError, GeneratorExit):
            book.outcome = Outcome.CANCELLED
            abort = self.registry.abort_requests(call, [request], call.hangup_reason)
            await asyncio.shield(abort)
            raise
        except EngineRefused as exc:
            raise InvalidRequest(f"the engine refused the request: {exc}") from exc
        except NoLiveWorker as exc:  # a split request's decode leg found none
            raise Unavailable(str(exc)) from exc
        except EngineError as exc:
            name = placement.worker.name  # split: the worker of the leg that failed
            raise EngineFailure(f"engine worker {name} failed the request: {exc}") from exc
        finally:
            book.tally.flush(time.perf_counter())  # first: nothing awaited may skip it
            try:
                await stream.aclose()  # may suspend (a split request releases its KV)
            finally:  # the books close even when the handler is cancelled meanwhile
                self._close_books(call, request, alias, book)

    def _close_books(self, call: Call, request: EngineCall, alias: str | None, book: Books) -> None:
        request.placement.give_back()  # a split runner gave its workers back, unless it never ran
        usage = request.usage()
        self.registry.detach(call, request)
        call.usage += usage  # with the detach: a cancel's answer counts it once, either way
        if isinstance(book.cancelled, RequestCancelled):
            book.cancelled.usage = usage
        if alias is not None:
            self.directory.release(alias, request.generated_tokens)
        self._record_end(call, request, book)

    def _count_tokens(self, call: Call, request: EngineCall, book: Books, n: int) -> None:
        """The call's and request's counts are exact at every token (cancel answers and
        ``GET /v2/requests`` read them); the shared series get them in batches
        (:mod:`gateway_server.metrics.token_books`), all of them when ``generate`` ends."""
        now = time.perf_counter()
        if book.last_token_at is None:
            book.first_token_at = now
            self._first_token.observe(now - book.started)
            request.started_decode = True
            book.tally.add(n, now, None)
        else:
            book.tally.add(n, now, (now - book.last_token_at) / n)
        book.last_token_at = now
        request.generated_tokens += n
        call.generated_tokens += n

    def _record_end(self, call: Call, request: EngineCall, book: Books) -> None:
        m = self.metrics
        outcome = Outcome.CANCELLED if request.cancel_reason is not None else book.outcome
        m.requests.labels(call.model, call.protocol.value, outcome.value).inc()
        reason, phase = request.cancel_reason, request.cancel_phase
        ended = time.perf_counter()
        consumed = request.consumption
        seconds = phase_seconds(book.started, ended, consumed, book.first_token_at)
        usage = request.usage()
        if outcome is Outcome.CANCELLED:
            reason = reason or call.hangup_reason
            phase = phase or Phase.QUEUED
            m.cancellations.labels(call.model, reason.value, phase.value).inc()
            m.wasted_tokens.labels(call.model).inc(request.generated_tokens)
            m.count_cancelled(call.model, reason, phase, usage, seconds)
        log_event(
            log,
            "request_end",
            request_id=request.alias or request.engine_request_id,
            call_id=call.call_id,
            model=call.model,
            protocol=call.protocol.value,
            outcome=outcome.value,
            reason=reason.value if reason else None,
            phase=phase.value if phase else None,
            prompt_tokens=consumed.prompt_tokens or book.prompt_tokens,
            generated_tokens=usage.completion_tokens,
            duration_s=round(ended - book.started, 6),
            **{f"{p.value}_s": round(seconds.get(p, 0.0), 6) for p in Phase},
        )


def _log_end(
    request_id: str,
    call_id: str,
    model: str,
    protocol: Protocol,
    outcome: Outcome,
    reason: Reason | None,
    phase: Phase | None,
) -> None:
    """The log line of a request that ended, cancelled, before it reached an engine."""
    log_event(
        log,
        "request_end",
        request_id=request_id,
        call_id=call_id,
        model=model,
        protocol=protocol.value,
        outcome=outcome.value,
        reason=reason.value if reason else None,
        phase=phase.value if phase else None,
        prompt_tokens=0,
        generated_tokens=0,
        duration_s=0.0,
        **{f"{p.value}_s": 0.0 for p in Phase},
    )
