"""What the vLLM engine knows of a request while it runs, and vLLM's outputs turned into the
seam's chunks (text, token counts, the finish reason, log-probabilities as vllm serve writes them).

Counts are vLLM's own: the prompt's token ids and the new token ids of each output, and after an
abort the final output vLLM's front end makes for it (``note_final``), which also carries the
tokens generated since the consumer's last read (vLLM merges outputs a consumer has not taken).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway_server.engine.base import (
    Consumption,
    EngineError,
    FinishReason,
    TokenChunk,
    TokenLogprob,
)

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(eq=False)
class Live:
    seq: int
    consumption: Consumption = field(default_factory=Consumption)
    """The gateway's record of what the request consumed, kept equal to the counts here."""
    counts_output: bool = True
    """Its output tokens go to ``consumption`` (not a P/D prefill leg's one token)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    seen_after: int | None = None
    """``steps`` when the engine core confirmed it holds the request; statistics received
    after that count it."""
    abort_task: asyncio.Task[None] | None = None
    confirm_task: asyncio.Task[None] | None = None
    """The utility call that confirms the core holds the request (phase bookkeeping only)."""
    prompt_logprobs_sent: bool = False
    collector: Any = None
    """vLLM's output collector of the request: after an abort it holds vLLM's final output
    (with what the consumer never read), which :func:`note_final` reads without taking it."""

    def count(self, prompt_token_ids: Any, new_tokens: int) -> None:
        """Add one output's counts (vLLM's own: its prompt's token ids, its new token ids)."""
        self.output_tokens += new_tokens
        if prompt_token_ids is not None:
            self.prompt_tokens = len(prompt_token_ids)
        consumption = self.consumption
        consumption.prompt_tokens = self.prompt_tokens
        if self.counts_output:
            consumption.output_tokens = self.output_tokens


def note_final(state: Live) -> None:
    """After an abort was applied: what vLLM's final output says the request consumed (its
    prompt's tokens, tokens generated but never read), noted in ``state.consumption`` and the
    output left in the collector for a consumer still reading (counted then, once)."""
    out = getattr(state.collector, "output", None)
    if out is None or isinstance(out, Exception) or not getattr(out, "outputs", None):
        return
    if out.prompt_token_ids is not None:
        state.consumption.prompt_tokens = len(out.prompt_token_ids)
    if state.counts_output:
        unread = len(out.outputs[0].token_ids)
        state.consumption.output_tokens = state.output_tokens + unread


def chunk(state: Live, out: Any, decode: Callable[[int], str]) -> TokenChunk:
    """The chunk of one of vLLM's ``RequestOutput`` s (deltas); counts go into ``state``.
    ``decode``: a token id's text, for log-probabilities vLLM did not decode."""
    completion = out.outputs[0]
    new_tokens = len(completion.token_ids)
    state.count(out.prompt_token_ids, new_tokens)
    finish = None
    if out.finished:
        reason = str(completion.finish_reason)
        if reason not in FINISH:
            raise EngineError(f"vLLM ended the request with {reason!r}")
        finish = FINISH[reason]
    logprobs = prompt_logprobs = None
    if completion.logprobs is not None:  # only when asked for
        logprobs = logprobs_of(completion.token_ids, completion.logprobs, decode)
    if out.prompt_logprobs is not None and not state.prompt_logprobs_sent:
        state.prompt_logprobs_sent = True
        prompt_logprobs = logprobs_of(out.prompt_token_ids, out.prompt_logprobs, decode)
    return TokenChunk(
        completion.text, new_tokens, state.prompt_tokens, finish, logprobs, prompt_logprobs
    )


def logprobs_of(
    token_ids: Sequence[int], steps: Sequence[Any], decode: Callable[[int], str]
) -> tuple[TokenLogprob, ...]:
    """vLLM's ``{token id: Logprob}`` per position as :class:`TokenLogprob` (the chosen token
    first, as vLLM orders them; -inf as -9999.0, as vllm serve writes it)."""
    out = []
    for token_id, step in zip(token_ids, steps, strict=False):
        chosen = step.get(token_id) if step is not None else None
        if chosen is None:
            out.append(TokenLogprob(_text(decode, token_id, None), None))
            continue
        top = tuple((_text(decode, i, lp), max(lp.logprob, -9999.0)) for i, lp in step.items())
        out.append(TokenLogprob(_text(decode, token_id, chosen), max(chosen.logprob, -9999.0), top))
    return tuple(out)


def _text(decode: Callable[[int], str], token_id: int, logprob: Any) -> str:
    if logprob is not None and logprob.decoded_token is not None:
        return str(logprob.decoded_token)
    return decode(token_id)
