"""A simulated continuous-batching engine: honest about being a simulation, faithful where
cancellation is concerned.

How it works. One task runs engine steps. Before each step it applies pending aborts (a step
boundary), then admits waiting requests into free batch slots, clients in turn and each client's
calls in turn (:mod:`gateway_server.engine.fair`; FIFO within a call). A step decodes one token
for every running sequence that finished its prefill and prefills up to ``prefill_chunk_tokens``
prompt tokens of those still reading their prompt (chunked prefill). The step lasts
``step_base_s + step_per_seq_s * batch + prefill_per_token_s * prefilled`` seconds: time grows
with batch size and prompt length. A request is ``queued`` until admitted, ``prefill`` until its
first token, ``decode`` after. Tokens are words of a fixed vocabulary drawn by :mod:`.sampling`
(a tiny language model with real temperature, top-k, top-p, min-p, logit bias and
log-probabilities) with a PRNG seeded from (engine seed, request seed, prompt): the same request
always gets the same text. Prompt "tokens" are whitespace-separated words, and never fewer than
one per ``CHARS_PER_TOKEN`` characters (a real tokenizer makes a long word many tokens: so the
context length bounds a prompt's bytes too); or token ids, vocabulary indices. The simulation
never emits end-of-sequence: requests end on ``max_tokens`` (finish ``length``), a stop string
or a stop token id (``stop``; not before ``min_tokens``). It has no penalties, no special tokens
and no prompt log-probabilities: those fields are refused by the OpenAI layer
(:attr:`SimulatedEngine.features`).

Disaggregated prefill/decode (:mod:`.handoff`): ``prefill`` runs a prompt like any request but,
once read, keeps its KV in the engine's :class:`~.kv.SavedKv` (counted in its cache use)
instead of generating. ``decode`` admits a request into a slot with its prompt's blocks
allocated and in phase ``transfer`` for ``transfer_per_block_s`` per block, then pulls the KV
from the prefill engine through the shared :class:`~.kv.SimKvStore` and decodes; KV that
is gone by then (released, lease expired) is recomputed: the request prefills as usual.

Faults (:meth:`SimulatedEngine.inject_fault`, reached through the gateway's fault switch, see
``gateway_server.http.faults``): ``kill`` makes the engine die as a vLLM engine core does when
its process is killed (every request in flight raises :class:`~.base.EngineDead`, ``alive``
turns false, aborts answer at once); ``hang`` stops its steps as a stopped process would (no
token, no abort applied) until ``resume``. For P/D: ``lose_notification`` (a prefill engine is
never told its KV was pulled), ``expire_leases`` (every handoff's KV it holds expires now),
``stall_transfer`` (transfers into this engine never complete: a decode leg whose KV never
arrives); ``resume`` ends them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator
from typing import Any

from gateway_server.engine.base import (
    ChatOptions,
    EngineDead,
    EngineError,
    EngineLoad,
    EngineRequest,
    Feature,
    FinishReason,
    RequestRejected,
    SamplingParams,
    TokenChunk,
)
from gateway_server.engine.fair import FairQueue
from gateway_server.engine.handoff import KvHandoff
from gateway_server.engine.sim.config import SIM_BLOCK_SIZE, SimConfig
from gateway_server.engine.sim.kv import SavedKv, SimKvStore
from gateway_server.engine.sim.sampling import VOCAB, Prepared, Sampler, piece
from gateway_server.engine.sim.sequence import Sequence
from gateway_server.engine.sim.tools import NoTools
from gateway_server.engine.tools import ToolCalling, ToolSettings
from hangup_contract.cancel_labels import Phase


class SimulatedEngine:
    """Implements :class:`~gateway_server.engine.base.Engine` without a model (see module doc)."""

    name = "the simulated engine"
    features = frozenset(
        {
            Feature.TOP_K,
            Feature.MIN_P,
            Feature.LOGIT_BIAS,
            Feature.STOP_TOKEN_IDS,
            Feature.MIN_TOKENS,
            Feature.LOGPROBS,
            Feature.ECHO,
            Feature.TOKEN_PROMPTS,
        }
    )
    vocab_size = len(VOCAB)

    def __init__(self, config: SimConfig, kv: SimKvStore | None = None) -> None:
        """``kv``: the store shared with the other engines of a disaggregated gateway."""
        self._config = config
        self._kv = kv if kv is not None else SimKvStore()
        self._saved = SavedKv(self._kv, SIM_BLOCK_SIZE)
        self._stall_transfers = False
        self._waiting = FairQueue[Sequence]()
        self._prepared = Prepared()
        self._running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        # Pending aborts: request id → one future per caller waiting for the step boundary.
        self._aborts: dict[str, list[asyncio.Future[None]]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._dead: EngineDead | None = None
        # A dead engine's last load stays, as a dead vLLM core's last statistics do.
        self._last_load: EngineLoad | None = None
        self._stepping = asyncio.Event()  # cleared while a ``hang`` fault holds the steps
        self._stepping.set()
        self.steps = 0
        """Steps run so far; tests and benchmarks read it to reason about step boundaries."""

    @property
    def max_model_len(self) -> int:
        return self._config.max_model_len

    @property
    def alive(self) -> bool:
        return self._dead is None and self._loop_task is not None and not self._loop_task.done()

    @property
    def death_cause(self) -> str:
        return str(self._dead) if self._dead is not None else ""

    def inject_fault(self, fault: str) -> None:
        """``kill``, ``hang`` or ``resume`` (see the module docstring). Raises ValueError for
        another name."""
        if fault in _PD_FAULTS:
            self._pd_fault(fault)
        elif fault == "kill":
            self._die(EngineDead("simulated engine killed (fault injection)"))
            if self._loop_task is not None:
                self._loop_task.cancel()
        elif fault == "hang":
            self._stepping.clear()
        elif fault == "resume":
            self._stepping.set()
            self._saved.keep_on_pull = self._stall_transfers = False
        else:
            raise ValueError(f"unknown fault {fault!r}: {', '.join(FAULTS)}")

    def _pd_fault(self, fault: str) -> None:
        if fault == "lose_notification":
            self._saved.keep_on_pull = True
        elif fault == "expire_leases":
            self._saved.expire(now=float("inf"))
        else:
            self._stall_transfers = True

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="sim-engine")

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for seq in [*self._waiting, *self._running]:
            self._finish(seq, FinishReason.ABORT)
        self._waiting.clear()
        self._running.clear()
        self._saved.clear()
        self._resolve_aborts()

    def count_prompt_tokens(self, prompt: str | tuple[int, ...]) -> int:
        """Token ids, or the words of a text and at least one per ``CHARS_PER_TOKEN`` of its
        characters (whitespace too)."""
        if isinstance(prompt, tuple):
            return len(prompt)
        return max(1, len(prompt.split()), -(-len(prompt) // CHARS_PER_TOKEN))

    def prompt_text(self, prompt: str | tuple[int, ...]) -> str:
        return " ".join(VOCAB[i] for i in prompt) if isinstance(prompt, tuple) else prompt

    def apply_chat_template(self, messages: list[dict[str, Any]], options: ChatOptions) -> str:
        """``role: content`` lines, then ``assistant:`` (the generation prompt); continuing the
        final message leaves it open. The template has no variables: ``template_kwargs`` are
        accepted and change nothing, as with a Jinja template that does not read them."""
        if options.tools:
            raise RequestRejected("'tools' is not supported by the simulated engine")
        if options.continue_final_message and messages[-1]["role"] != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        if options.add_generation_prompt:
            lines.append("assistant:")
        return "\n".join(lines)

    def check(self, params: SamplingParams) -> None:
        """The simulation writes free text only: a structured output is refused, by field."""
        if params.structured is not None:
            raise RequestRejected(
                f"'{params.structured.source}' is not supported by the simulated engine"
            )

    def tool_calling(self, settings: ToolSettings, model: str) -> ToolCalling:
        return NoTools()

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenChunk, None]:
        return self._stream(request, None)

    def decode(
        self, request: EngineRequest, handoff: KvHandoff
    ) -> AsyncGenerator[TokenChunk, None]:
        return self._stream(request, handoff)

    async def prefill(self, request: EngineRequest, key: str) -> KvHandoff | None:
        seq = self._enqueue(request)
        seq.save_as = key
        try:
            chunk = await seq.out.get()
        finally:
            if not seq.finished:  # the caller left: free the slot at the next boundary
                self._aborts.setdefault(request.request_id, [])
                self._wake.set()
        if isinstance(chunk, EngineDead):
            raise chunk
        return seq.handoff if chunk.finish_reason is not FinishReason.ABORT else None

    async def release(self, key: str) -> int:
        return self._saved.release(key)

    def kv_blocks(self, request_id: str) -> int:
        seq = self._by_id.get(request_id)
        return -(-seq.held_tokens // SIM_BLOCK_SIZE) if seq is not None else 0

    def handoff_blocks(self) -> int:
        return self._saved.blocks()

    def _enqueue(self, request: EngineRequest) -> Sequence:
        if not self.alive:
            raise EngineError("simulated engine is not running")
        if request.request_id in self._by_id:
            raise EngineError(f"engine request id {request.request_id} is already running")
        seed = f"{self._config.seed}:{request.params.seed}:{request.prompt}"
        bias, stop_ids = self._prepared.read(request.params)
        sampler = Sampler(request.params, random.Random(seed), bias)
        prompt_tokens = self.count_prompt_tokens(request.prompt)
        seq = Sequence(request, prompt_tokens, sampler, stop_ids)
        request.consumption.prompt_tokens = prompt_tokens
        self._by_id[request.request_id] = seq
        self._waiting.push(request.share, request.request_id, seq)
        self._wake.set()
        return seq

    async def _stream(
        self, request: EngineRequest, handoff: KvHandoff | None
    ) -> AsyncGenerator[TokenChunk, None]:
        seq = self._enqueue(request)
        seq.handoff = handoff
        try:
            while True:
                chunk = await seq.out.get()
                if isinstance(chunk, EngineDead):
                    raise chunk
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if not seq.finished:  # the consumer left early: free the slot at the next boundary
                self._aborts.setdefault(request.request_id, [])
                self._wake.set()

    async def abort(self, request_id: str) -> None:
        if request_id not in self._by_id or self._dead is not None:
            return
        # A future per caller: one caller giving up (cancelled) never disturbs another's wait,
        # and the abort stays registered either way.
        done = asyncio.get_running_loop().create_future()
        self._aborts.setdefault(request_id, []).append(done)
        self._wake.set()
        await done

    def phase(self, request_id: str) -> Phase | None:
        seq = self._by_id.get(request_id)
        return seq.phase if seq is not None else None

    def load(self) -> EngineLoad:
        if self._last_load is not None:
            return self._last_load
        capacity = self._config.slots * self._config.max_model_len
        held = sum(seq.held_tokens for seq in self._running) + self._saved.tokens()
        blocks = -(-capacity // SIM_BLOCK_SIZE)  # the cache as blocks of vLLM's default size
        return EngineLoad(
            len(self._running), len(self._waiting), held / capacity, blocks, SIM_BLOCK_SIZE
        )

    # -- the step loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                await self._stepping.wait()
                self._resolve_aborts()
                self._admit()
                self._prepared.forget()  # the choices of a call came together: keep nothing
                if not self._running:
                    self._wake.clear()
                    if not self._aborts and not self._waiting:
                        await self._wake.wait()
                    continue
                prefill = self._plan_prefill()
                cfg = self._config
                duration = (
                    cfg.step_base_s
                    + cfg.step_per_seq_s * len(self._running)
                    + cfg.prefill_per_token_s * sum(prefill.values())
                )
                await asyncio.sleep(duration)
                await self._stepping.wait()
                self.steps += 1
                # The boundary: aborts that arrived during the step land before its outputs go
                # out, and their waiters run before the batch's token fan-out does.
                if self._resolve_aborts():
                    await asyncio.sleep(0)
                self._complete_step(prefill)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug in the simulation must not hang consumers
            self._die(EngineDead(f"simulated engine failed: {type(exc).__name__}: {exc}"))
            raise

    def _die(self, cause: EngineDead) -> None:
        """Fail every request with ``cause`` and answer every abort waiter: nothing runs now."""
        if self._dead is not None:
            return
        self._dead = cause
        self._last_load = self.load()
        for seq in [*self._waiting, *self._running]:
            seq.finished = True
            seq.out.put_nowait(cause)
        self._waiting.clear()
        self._running.clear()
        self._by_id.clear()
        self._saved.clear()
        self._resolve_aborts()

    def _resolve_aborts(self) -> bool:
        """Apply pending aborts; True when there were any."""
        aborts, self._aborts = self._aborts, {}
        for request_id, waiters in aborts.items():
            seq = self._by_id.get(request_id)
            if seq is not None:
                if seq in self._running:
                    self._running.remove(seq)
                else:
                    self._waiting.remove(seq.request.share, request_id)
                self._finish(seq, FinishReason.ABORT)
            for done in waiters:
                if not done.done():
                    done.set_result(None)
        return bool(aborts)

    def _admit(self) -> None:
        now = time.perf_counter()
        while self._waiting and len(self._running) < self._config.slots:
            seq = self._waiting.pop()
            seq.phase = Phase.PREFILL
            seq.request.consumption.admitted(now)
            if seq.handoff is not None:  # the prompt's blocks are allocated, the KV is on its way
                seq.phase, seq.prefilled = Phase.TRANSFER, seq.prompt_tokens
                transfer_s = self._config.transfer_per_block_s * seq.handoff.blocks
                seq.transfer_done_at = time.monotonic() + transfer_s
            self._running.append(seq)

    def _plan_prefill(self) -> dict[Sequence, int]:
        budget = self._config.prefill_chunk_tokens
        plan: dict[Sequence, int] = {}
        for seq in self._running:
            if seq.phase is Phase.PREFILL and budget > 0:
                take = min(budget, seq.prompt_tokens - seq.prefilled)
                plan[seq] = take
                budget -= take
        return plan

    def _complete_step(self, prefill: dict[Sequence, int]) -> None:
        for seq in list(self._running):  # aborted ones already left: they emit nothing more
            if seq.phase is Phase.TRANSFER:
                self._transfer(seq)
                continue
            if seq.phase is Phase.PREFILL:
                seq.prefilled += prefill.get(seq, 0)
                if seq.prefilled < seq.prompt_tokens:
                    continue
                if seq.save_as is not None:
                    self._save(seq)
                    continue
                seq.phase = Phase.DECODE  # the step that ends prefill yields the first token
            self._emit_token(seq)

    def _save(self, seq: Sequence) -> None:
        """A prefill-only request read its prompt: keep the KV for a decode engine, and end."""
        assert seq.save_as is not None
        blocks, expires = self._saved.save(seq.save_as, seq.prompt_tokens, self._config.kv_lease_s)
        seq.handoff = KvHandoff(
            seq.save_as, seq.request.request_id, seq.prompt_tokens, blocks, expires
        )
        self._running.remove(seq)
        self._finish(seq, FinishReason.LENGTH)

    def _transfer(self, seq: Sequence) -> None:
        """Load the prompt's KV once its transfer time has passed; recompute it when gone."""
        if self._stall_transfers or time.monotonic() < seq.transfer_done_at:
            return
        assert seq.handoff is not None
        if self._kv.pull(seq.handoff.key):
            seq.phase = Phase.DECODE  # the next step yields the first token
        else:
            seq.phase, seq.prefilled = Phase.PREFILL, 0

    def _emit_token(self, seq: Sequence) -> None:
        params = seq.request.params
        prev, first = seq.sampler.prev, seq.generated == 0
        token = seq.sampler.next()
        text = piece(token, first)
        seq.generated += 1
        seq.request.consumption.output_tokens = seq.generated
        logprobs = None
        if params.logprobs is not None:  # only when asked for: it costs a sort per token
            logprobs = (seq.sampler.logprob(prev, token, first),)
        finish: FinishReason | None = None
        search = seq.generated > params.min_tokens
        if search and token in seq.stop_ids:
            finish = FinishReason.STOP
        elif params.stop:
            text, finish = seq.cut_at_stop(text, search)
        if finish is None and (
            seq.generated >= params.max_tokens
            or seq.prompt_tokens + seq.generated >= self._config.max_model_len
        ):
            finish = FinishReason.LENGTH
        seq.out.put_nowait(TokenChunk(text, 1, seq.prompt_tokens, finish, logprobs))
        if finish is not None:
            self._running.remove(seq)
            self._finish(seq, finish, emitted=True)

    def _finish(self, seq: Sequence, reason: FinishReason, *, emitted: bool = False) -> None:
        if seq.finished:
            return
        seq.finished = True
        self._by_id.pop(seq.request.request_id, None)
        if not emitted:
            seq.out.put_nowait(TokenChunk("", 0, seq.prompt_tokens, reason))


CHARS_PER_TOKEN = 16
"""A prompt is at least one token per this many characters: a real tokenizer's tokens average
about four characters of English and seldom pass sixteen."""
_PD_FAULTS = ("lose_notification", "expire_leases", "stall_transfer")
FAULTS = ("kill", "hang", "resume", *_PD_FAULTS)
"""The faults :meth:`SimulatedEngine.inject_fault` knows."""
