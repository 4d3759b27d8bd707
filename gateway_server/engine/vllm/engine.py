"""The vLLM engine: one vLLM ``AsyncLLM`` per worker, behind :class:`~.base.Engine`.

How it works
------------
``AsyncLLM`` runs the scheduler and the model in an *engine core* process it spawns; this process
keeps the tokenizer, the detokenizer and one output queue per request. :meth:`VllmEngine.generate`
adds a request with ``AsyncLLM.add_request`` (output kind ``DELTA``) and relays each delta as a
:class:`~.base.TokenChunk`, counting output tokens from the engine's own token ids.

Abort. ``AsyncLLM.abort`` ends the request's output stream at once and sends an ABORT message to
the engine core, which applies it between model steps, freeing the batch slot and KV-cache
blocks. :meth:`VllmEngine.abort` returns once a call queued behind it is answered, which proves
the abort applied (:mod:`.core_calls`).

Phase. vLLM emits nothing for a request before its first output token (the engine core returns
no partial-prefill outputs), so the engine tells phases apart like this:

- ``decode``: at least one output token has arrived;
- ``queued`` vs ``prefill``: from the scheduler's per-step statistics (a stat logger receives
  them after every step). After adding a request the engine makes a call the core answers
  between steps; its answer proves the core holds the request, so statistics of the steps after
  it count the request (:mod:`.core_calls`). Until such statistics arrive the request is
  ``queued`` (no step is known to have scheduled it). After that, with first-come-first-served
  scheduling, the ``W`` requests the scheduler reports waiting are the ``W`` latest arrivals
  among those without a token yet (``queued``); the others are in ``prefill``. An inference,
  exact unless vLLM preempts; it may call a request ``queued`` for a step or two after its
  prefill began.

The token path waits for nothing but the engine's outputs. The core answers a utility call only
between steps, so the confirmation above runs beside the stream, never before its first read:
awaited first, it held back every token produced until its answer came (a step or more; with
DELTA outputs they then left merged into one chunk).

Load. ``load()`` reports the latest scheduler statistics: running requests, waiting requests and
KV-cache usage. Running is capped by the requests this engine has in flight and the rest of them
count as waiting, so a request still being tokenized counts too.

Workers and devices. :func:`~.factory.vllm_engine_factory` makes each worker's engine with its
own GPUs when GPUs exist. Scheduler statistics reach the gateway through a stat logger
(:mod:`.stats`).

Failures. A worker that fails to start raises :class:`~.base.EngineError` naming the worker and
the model. When an engine core dies later, vLLM's monitor marks the client dead; every request
in flight on that worker raises :class:`~.base.EngineDead` and :attr:`VllmEngine.alive` turns
False. Other workers are separate processes and keep serving. :attr:`VllmEngine.death_cause`
names the core's exit status (or the signal that killed it) and vLLM's last error line, read from
the output of the core's processes (:mod:`.output_tail`); shutting the dead engine down kills
what is left of the process tree the core had when it became ready (:mod:`.process_tree`) and
unlinks the IPC socket files its start made (:mod:`.ipc`), and the pool starts a new engine for
the worker. A shutdown that comes while vLLM loads (a restart
under way) waits for the loading thread, which cannot be interrupted, then stops what it made.

vLLM is imported through ``importlib`` when a worker starts: importing this module stays cheap and
the type checker does not walk vLLM and torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator
from importlib import import_module
from pathlib import Path
from typing import Any

from gateway_server.engine.base import (
    ChatOptions,
    EngineDead,
    EngineError,
    EngineLoad,
    EngineRefused,
    EngineRequest,
    Feature,
    NoChatTemplate,
    NoFaults,
    RequestRejected,
    SamplingParams,
    TokenChunk,
)
from gateway_server.engine.devices import DevicePin, device_env
from gateway_server.engine.tools import ToolCalling, ToolSettings
from gateway_server.engine.vllm import process_tree
from gateway_server.engine.vllm.core_calls import abort_applied, note_held
from gateway_server.engine.vllm.inputs import prompt_input, sampling_params
from gateway_server.engine.vllm.ipc import IpcDirectory
from gateway_server.engine.vllm.options import VllmOptions
from gateway_server.engine.vllm.output_tail import OutputTail
from gateway_server.engine.vllm.outputs import Live, note_final
from gateway_server.engine.vllm.outputs import chunk as to_chunk
from gateway_server.engine.vllm.stats import (
    SchedulerSnapshot,
    scheduler_statistics_only,
    stat_logger_factory,
)
from gateway_server.engine.vllm.tools import VllmToolCalling
from hangup_contract.cancel_labels import Phase
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway.vllm")


class VllmEngine:
    """One vLLM ``AsyncLLM`` worker. See the module docstring for how abort and phase work."""

    name = "the vLLM engine"
    features = frozenset(Feature)

    def __init__(
        self,
        model: str,
        options: VllmOptions,
        *,
        index: int = 0,
        devices: DevicePin | None = None,
        spawn_lock: threading.Lock | None = None,
        ipc: IpcDirectory | None = None,
    ) -> None:
        self.model = model
        self.options = options
        self.index = index
        self.devices = devices
        self._spawn_lock = spawn_lock or threading.Lock()
        self._ipc = ipc or IpcDirectory()
        self._ipc_files: set[Path] = set()
        self._llm: Any = None
        self._tokenizer_copy: Any = None
        self._stopped = False
        self._live: dict[str, Live] = {}
        self._unadmitted: dict[str, Live] = {}
        """Live requests not yet seen out of the waiting queue (see :meth:`_note_admitted`)."""
        self._arrivals = itertools.count(1)
        self._stats = SchedulerSnapshot(on_step=self._note_admitted)
        self._processes: list[process_tree.ProcessId] = []
        self._output = OutputTail()
        self._shutting: asyncio.Future[None] | None = None
        self._exits: list[str] | None = None

    # -- life cycle ------------------------------------------------------------------------

    @property
    def max_model_len(self) -> int:
        if self._llm is not None:
            return int(self._llm.model_config.max_model_len)
        return self.options.max_model_len or 0

    @property
    def alive(self) -> bool:
        return self._llm is not None and not self._stopped and not self._llm.errored

    @property
    def death_cause(self) -> str:
        if self._llm is None or self.alive:
            return ""
        # As found when the shutdown began: the shutdown itself stops a core still running.
        causes = list(self._exits if self._exits is not None else self._exit_statuses())
        if error := self._output.last_error():
            causes.append(f"last error: {error}")
        return "; ".join(causes) or "vLLM marked its engine core dead"

    def _exit_statuses(self) -> list[str]:
        return process_tree.exit_statuses(self._llm)

    async def start(self) -> None:
        """Spawn the engine core and load the model (off the event loop).

        Raises EngineError naming the worker and the model when vLLM cannot start.
        """
        if self._llm is not None:
            return
        started = time.monotonic()
        building = asyncio.ensure_future(asyncio.to_thread(self._build))
        try:
            self._llm, self._tokenizer_copy = await asyncio.shield(building)
        except asyncio.CancelledError:
            await self._abandon(building)
            raise
        except Exception as exc:
            await asyncio.to_thread(self._output.close)
            error = self._output.last_error()
            raise EngineError(
                f"vLLM worker {self.index} could not load {self.model!r}: "
                f"{type(exc).__name__}: {exc}" + (f" (engine core: {error})" if error else "")
            ) from exc
        self._processes = process_tree.snapshot(self.engine_core_pids)
        self._output.forget()  # what the core printed while starting, the gateway's lines too
        log_event(
            log,
            "vllm_worker_ready",
            worker=self.index,
            model=self.model,
            max_model_len=self.max_model_len,
            devices=list(self.devices.ids) if self.devices else [],
            engine_core_pids=self.engine_core_pids,
            start_s=round(time.monotonic() - started, 1),
        )

    @property
    def engine_core_pids(self) -> list[int]:
        """Process ids of this worker's vLLM engine core(s), for operators; [] if not known."""
        return process_tree.core_pids(self._llm)

    def _build(self) -> tuple[Any, Any]:
        engine_args: Any = import_module("vllm.engine.arg_utils")
        async_llm: Any = import_module("vllm.v1.engine.async_llm")
        args = engine_args.AsyncEngineArgs(
            model=self.model, disable_log_stats=True, **self._engine_args()
        )
        # disable_log_stats drops vLLM's logging logger; ours takes the place of its Prometheus
        # logger and still gets every step's scheduler statistics (see .stats).
        factory = stat_logger_factory(self._stats)
        with (
            self._spawn_lock,
            device_env(self.devices),
            self._output.capture(),
            self._ipc.files_made() as self._ipc_files,
        ):
            llm = async_llm.AsyncLLM.from_engine_args(args, stat_loggers=[factory])
        scheduler_statistics_only(llm)
        # vLLM tokenizes in a thread of its own; a Hugging Face tokenizer must not be used from
        # two threads at once, so the gateway's counting and chat templating use a copy.
        return llm, copy.deepcopy(llm.get_tokenizer())

    async def _abandon(self, building: asyncio.Future[tuple[Any, Any]]) -> None:
        """Shutdown came while vLLM was loading: wait for the loading thread (it cannot be
        interrupted), then stop the engine it made (its core must not outlive the gateway)."""
        log_event(log, "vllm_start_abandoned", logging.WARNING, worker=self.index)
        with contextlib.suppress(Exception):
            self._llm, self._tokenizer_copy = await building
            self._processes = process_tree.snapshot(self.engine_core_pids)
        await self.shutdown()

    def _engine_args(self) -> dict[str, Any]:
        """``AsyncEngineArgs``' keywords (model excluded); the P/D engine adds its connector."""
        return self.options.engine_args()

    def _sampling_for(self, request: EngineRequest) -> Any:
        """vLLM's sampling parameters for ``request``; the P/D engine adds each leg's
        ``kv_transfer_params``."""
        return sampling_params(request.params)

    async def shutdown(self) -> None:
        """Abort what is running (streams end with ABORT), then stop the engine core.
        Idempotent: a second call awaits the first."""
        self._stopped = True
        if self._shutting is None:
            self._shutting = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._shutting)

    async def _shutdown(self) -> None:
        llm = self._llm
        try:
            if llm is None:
                return
            await asyncio.gather(*(self.abort(rid) for rid in list(self._live)))
            self._exits = self._exit_statuses()
            try:
                await asyncio.to_thread(llm.shutdown)
            finally:
                left = process_tree.kill_leftovers(self._processes)
                if left:
                    log_event(
                        log, "vllm_leftovers_killed", logging.WARNING, worker=self.index, pids=left
                    )
        finally:
            self._ipc.remove(self._ipc_files)
            await asyncio.to_thread(self._output.close)

    # -- requests --------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self._llm.model_config.get_vocab_size()) if self._llm is not None else 0

    def count_prompt_tokens(self, prompt: str | tuple[int, ...]) -> int:
        return len(prompt) if isinstance(prompt, tuple) else len(self._tokenizer().encode(prompt))

    def prompt_text(self, prompt: str | tuple[int, ...]) -> str:
        return str(self._tokenizer().decode(list(prompt))) if isinstance(prompt, tuple) else prompt

    def apply_chat_template(self, messages: list[dict[str, Any]], options: ChatOptions) -> str:
        tokenizer = self._tokenizer()
        if not getattr(tokenizer, "chat_template", None):
            raise NoChatTemplate(f"model {self.model!r} has no chat template; use /v1/completions")
        prompt = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            tools=list(options.tools) if options.tools else None,
            **dict(options.template_kwargs),
        )
        return str(prompt)

    def check(self, params: SamplingParams) -> None:
        """vLLM's own check of a structured output (what ``add_request`` runs first): a schema,
        pattern or grammar its backend cannot compile is refused here, before any answer
        starts, with vLLM's words."""
        if params.structured is None:
            return
        processor = self._llm.input_processor
        client_fault: Any = import_module("vllm.exceptions").VLLMClientError
        try:
            sampling_params(params).verify(
                processor.model_config,
                processor.speculative_config,
                processor.structured_outputs_config,
                self._tokenizer(),
            )
        except (ValueError, client_fault) as exc:
            raise RequestRejected(str(exc)) from exc

    def tool_calling(self, settings: ToolSettings, model: str) -> ToolCalling:
        return VllmToolCalling(settings, self._tokenizer(), model)

    def _tokenizer(self) -> Any:
        if self._tokenizer_copy is None:
            raise EngineError(f"vLLM worker {self.index} is not started")
        return self._tokenizer_copy

    async def generate(self, request: EngineRequest) -> AsyncGenerator[TokenChunk, None]:
        """Run one request; the last chunk carries the finish reason (ABORT when aborted).

        Raises EngineDead when the worker is (or goes) dead, EngineError when vLLM refuses or
        fails the request. Closing the generator early aborts the request (in the background;
        :meth:`abort` awaits that same abort).
        """
        llm = self._llm
        if not self.alive:
            raise EngineDead(f"vLLM worker {self.index} is not running")
        rid = request.request_id
        if rid in self._live:
            raise EngineError(f"engine request id {rid} is already running")
        counts = self._counts_output(rid)
        state = self._live[rid] = Live(next(self._arrivals), request.consumption, counts)
        finished = False
        collector: Any = None
        try:
            try:
                sampling = self._sampling_for(request)
                collector = state.collector = await llm.add_request(
                    rid, prompt_input(request), sampling
                )
            except ValueError as exc:  # vLLM's validation of the request (VLLMValidationError)
                raise EngineRefused(str(exc)) from exc
            finally:
                state.registered.set()
            self._unadmitted[rid] = state
            state.confirm_task = asyncio.ensure_future(note_held(llm, state, self._stats))
            while not finished:
                out = collector.get_nowait() or await collector.get()
                chunk = self._chunk(state, out)
                finished = chunk.finish_reason is not None
                yield chunk
        except Exception as exc:
            raise self._translate(exc) from exc
        finally:
            if state.confirm_task is not None and not state.confirm_task.done():
                state.confirm_task.cancel()
                await asyncio.wait([state.confirm_task])
            if collector is not None:
                collector.close()
            self._unadmitted.pop(rid, None)
            if finished:
                self._live.pop(rid, None)
            else:
                # The consumer left early (or the engine failed): abort in the background. The
                # request stays known, with its phase, until the engine has applied the abort;
                # the caller's own abort() awaits the same task.
                self._abort_once(rid, state)

    def _counts_output(self, request_id: str) -> bool:
        """Whether the request's output tokens are what it consumed (the P/D engine says no for
        a prefill leg: its one token is not the answer's)."""
        return True

    def _chunk(self, state: Live, out: Any) -> TokenChunk:
        """One of vLLM's outputs as a chunk (the P/D engine also reads its handoff from it)."""
        return to_chunk(state, out, self._decode_token)

    def _decode_token(self, token_id: int) -> str:
        return str(self._tokenizer().decode([token_id]))

    def _translate(self, exc: Exception) -> EngineError:
        if isinstance(exc, EngineError):
            return exc
        if type(exc).__name__ == "EngineDeadError" or (self._llm and self._llm.errored):
            return EngineDead(f"vLLM worker {self.index} died: its engine core exited")
        return EngineError(f"vLLM worker {self.index}: {type(exc).__name__}: {exc}")

    async def abort(self, request_id: str) -> None:
        """Abort; returns once the engine core has applied it (at a step boundary).

        Idempotent; returns at once for an unknown or finished id and when the worker is dead.
        """
        state = self._live.get(request_id)
        if state is not None:
            await asyncio.shield(self._abort_once(request_id, state))

    def _abort_once(self, request_id: str, state: Live) -> asyncio.Task[None]:
        if state.abort_task is None:
            state.abort_task = asyncio.ensure_future(self._abort(request_id, state))
        return state.abort_task

    def _forget(self, request_id: str, state: Live) -> None:
        if self._live.get(request_id) is state:
            del self._live[request_id]

    async def _abort(self, request_id: str, state: Live) -> None:
        try:
            await abort_applied(self._llm, request_id, state, self.index)
            note_final(state)  # vLLM's final output: counts the consumer may never read
        finally:
            self._forget(request_id, state)

    # -- reading ---------------------------------------------------------------------------

    def phase(self, request_id: str) -> Phase | None:
        state = self._live.get(request_id)
        if state is None:
            return None
        if state.output_tokens:
            return Phase.DECODE
        return Phase.PREFILL if self._admitted(state, self._waiting_from()) else Phase.QUEUED

    def _admitted(self, state: Live, waiting_from: int | None) -> bool:
        """Whether a request without a token yet is out of the waiting queue (``prefill``)."""
        # Statistics read just before the core's answer may still be on their way in: one step of
        # margin, so a request is never called ``prefill`` on numbers that do not count it.
        if state.seen_after is None or self._stats.steps <= state.seen_after + 1:
            return False
        return waiting_from is None or state.seq < waiting_from

    def _waiting_from(self) -> int | None:
        """The arrival from which the requests without a token yet are waiting; None when
        none is. FCFS: the scheduler's ``W`` waiting requests are the latest ``W`` arrivals
        without a token yet (all of them when they are fewer)."""
        waiting = self._stats.waiting
        if not waiting:
            return None
        ahead = sorted(
            s.seq for s in self._live.values() if not s.output_tokens and s.registered.is_set()
        )
        return ahead[max(len(ahead) - waiting, 0)] if ahead else None

    def _note_admitted(self) -> None:
        """After each step's statistics: the moment requests left the waiting queue, by the rule
        :meth:`phase` reads (``Consumption.admitted_at``). Work only while some request has not
        been seen out of the queue: one pass over those without a token."""
        pending = self._unadmitted
        if not pending:
            return
        now, waiting_from = time.perf_counter(), self._waiting_from()
        for rid, state in list(pending.items()):
            if state.output_tokens:  # its first token came first: queued until then
                del pending[rid]
            elif self._admitted(state, waiting_from):
                state.consumption.admitted(now)
                del pending[rid]

    def inject_fault(self, fault: str) -> None:
        raise NoFaults("the vLLM engine takes no injected faults")

    def load(self) -> EngineLoad:
        stats = self._stats
        in_flight = len(self._live)
        running = min(stats.running, in_flight)
        cache = self._llm.vllm_config.cache_config if self._llm is not None else None
        blocks = int(getattr(cache, "num_gpu_blocks", 0) or 0)
        block_size = int(getattr(cache, "block_size", 0) or 0)
        # KV use as the core reports it, never inferred from what is in flight here: an abort
        # that did not reach the core shows as cache still held (the vLLM tests rely on it).
        return EngineLoad(running, in_flight - running, stats.kv_cache_usage, blocks, block_size)
