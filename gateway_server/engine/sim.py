"""A simulated continuous-batching engine: honest about being a simulation, faithful where
cancellation is concerned.

How it works. One task runs engine steps. Before each step it applies pending aborts (a step
boundary), then admits waiting requests FIFO into free batch slots. A step decodes one token for
every running sequence that finished its prefill and prefills up to ``prefill_chunk_tokens``
prompt tokens of those still reading their prompt (chunked prefill). The step lasts
``step_base_s + step_per_seq_s * batch + prefill_per_token_s * prefilled`` seconds: time grows
with batch size and prompt length. A request is ``queued`` until admitted, ``prefill`` until its
first token, ``decode`` after. Tokens are words drawn from a fixed vocabulary by a PRNG seeded
from (engine seed, request seed, prompt): the same request always gets the same text. Prompt
"tokens" are whitespace-separated words. The simulation never emits end-of-sequence: requests
end on ``max_tokens`` (finish ``length``) or a stop string (``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from gateway_server.engine.base import (
    EngineError,
    EngineLoad,
    EngineRequest,
    FinishReason,
    RequestRejected,
    SamplingParams,
    TokenChunk,
)
from hangup_contract.vocabulary import Phase

_WORDS = tuple(
    "the quick brown fox jumps over a lazy dog while engines hum and tokens flow through "
    "queues of patient requests waiting for their turn on busy accelerators".split()
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    slots: int = 8
    max_model_len: int = 4096
    step_base_s: float = 0.01
    step_per_seq_s: float = 0.0005
    prefill_per_token_s: float = 0.00002
    prefill_chunk_tokens: int = 512
    seed: int = 0


SIM_BLOCK_SIZE = 16
"""Tokens per simulated KV-cache block (vLLM's default on GPUs): the simulation holds every
running sequence's tokens, ``slots * max_model_len`` of them, and reports them as blocks."""


@dataclass(eq=False)
class _Sequence:
    request: EngineRequest
    prompt_tokens: int
    rng: random.Random
    out: asyncio.Queue[TokenChunk] = field(default_factory=asyncio.Queue)
    prefilled: int = 0
    generated: int = 0
    text: str = ""
    phase: Phase = Phase.QUEUED
    finished: bool = False

    @property
    def held_tokens(self) -> int:
        return self.prefilled + self.generated


class SimulatedEngine:
    """Implements :class:`~gateway_server.engine.base.Engine` without a model (see module doc)."""

    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        # Pending aborts: request id → one future per caller waiting for the step boundary.
        self._aborts: dict[str, list[asyncio.Future[None]]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._dead: BaseException | None = None
        self.steps = 0
        """Steps run so far; tests and benchmarks read it to reason about step boundaries."""

    @property
    def max_model_len(self) -> int:
        return self._config.max_model_len

    @property
    def alive(self) -> bool:
        return self._dead is None and self._loop_task is not None and not self._loop_task.done()

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
        self._resolve_aborts()

    def count_prompt_tokens(self, prompt: str) -> int:
        return max(1, len(prompt.split()))

    def apply_chat_template(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        if tools:
            raise RequestRejected("'tools' is not supported by the simulated engine")
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])

    def check(self, params: SamplingParams) -> None:
        """The simulation writes free text only: a structured output is refused, by field."""
        if params.structured is not None:
            raise RequestRejected(
                f"'{params.structured.source}' is not supported by the simulated engine"
            )

    def tool_tokenizer(self) -> None:
        return None

    async def generate(self, request: EngineRequest) -> AsyncGenerator[TokenChunk, None]:
        if not self.alive:
            raise EngineError("simulated engine is not running")
        if request.request_id in self._by_id:
            raise EngineError(f"engine request id {request.request_id} is already running")
        seed = f"{self._config.seed}:{request.params.seed}:{request.prompt}"
        seq = _Sequence(request, self.count_prompt_tokens(request.prompt), random.Random(seed))
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)
        self._wake.set()
        try:
            while True:
                chunk = await seq.out.get()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if not seq.finished:  # the consumer left early: free the slot at the next boundary
                self._aborts.setdefault(request.request_id, [])
                self._wake.set()

    async def abort(self, request_id: str) -> None:
        if request_id not in self._by_id:
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
        capacity = self._config.slots * self._config.max_model_len
        held = sum(seq.held_tokens for seq in self._running)
        blocks = -(-capacity // SIM_BLOCK_SIZE)  # the cache as blocks of vLLM's default size
        return EngineLoad(len(self._running), len(self._waiting), held / capacity, blocks,
                          SIM_BLOCK_SIZE)  # fmt: skip

    # -- the step loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self._resolve_aborts()
                self._admit()
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
                self.steps += 1
                # The boundary: aborts that arrived during the step land before its outputs go
                # out, and their waiters run before the batch's token fan-out does.
                if self._resolve_aborts():
                    await asyncio.sleep(0)
                self._complete_step(prefill)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug in the simulation must not hang consumers
            self._dead = exc
            for seq in [*self._waiting, *self._running]:
                self._finish(seq, FinishReason.ABORT)
            raise

    def _resolve_aborts(self) -> bool:
        """Apply pending aborts; True when there were any."""
        aborts, self._aborts = self._aborts, {}
        for request_id, waiters in aborts.items():
            seq = self._by_id.get(request_id)
            if seq is not None:
                if seq in self._running:
                    self._running.remove(seq)
                else:
                    with contextlib.suppress(ValueError):
                        self._waiting.remove(seq)
                self._finish(seq, FinishReason.ABORT)
            for done in waiters:
                if not done.done():
                    done.set_result(None)
        return bool(aborts)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self._config.slots:
            seq = self._waiting.popleft()
            seq.phase = Phase.PREFILL
            self._running.append(seq)

    def _plan_prefill(self) -> dict[_Sequence, int]:
        budget = self._config.prefill_chunk_tokens
        plan: dict[_Sequence, int] = {}
        for seq in self._running:
            if seq.phase is Phase.PREFILL and budget > 0:
                take = min(budget, seq.prompt_tokens - seq.prefilled)
                plan[seq] = take
                budget -= take
        return plan

    def _complete_step(self, prefill: dict[_Sequence, int]) -> None:
        for seq in list(self._running):  # aborted ones already left: they emit nothing more
            if seq.phase is Phase.PREFILL:
                seq.prefilled += prefill.get(seq, 0)
                if seq.prefilled < seq.prompt_tokens:
                    continue
                seq.phase = Phase.DECODE  # the step that ends prefill yields the first token
            self._emit_token(seq)

    def _emit_token(self, seq: _Sequence) -> None:
        params = seq.request.params
        word = seq.rng.choice(_WORDS)
        piece = word if seq.generated == 0 else " " + word
        seq.generated += 1
        seq.text += piece
        finish: FinishReason | None = None
        for stop in params.stop:
            if stop and stop in seq.text:
                cut = seq.text.index(stop)
                piece = piece[: max(0, len(piece) - (len(seq.text) - cut))]
                finish = FinishReason.STOP
                break
        if finish is None and (
            seq.generated >= params.max_tokens
            or seq.prompt_tokens + seq.generated >= self._config.max_model_len
        ):
            finish = FinishReason.LENGTH
        seq.out.put_nowait(TokenChunk(piece, 1, seq.prompt_tokens, finish))
        if finish is not None:
            self._running.remove(seq)
            self._finish(seq, finish, emitted=True)

    def _finish(self, seq: _Sequence, reason: FinishReason, *, emitted: bool = False) -> None:
        if seq.finished:
            return
        seq.finished = True
        self._by_id.pop(seq.request.request_id, None)
        if not emitted:
            seq.out.put_nowait(TokenChunk("", 0, seq.prompt_tokens, reason))
