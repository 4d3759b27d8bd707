"""One request inside the simulated engine: where it is, what it generated, where it goes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway_server.engine.base import EngineDead, EngineRequest, FinishReason, TokenChunk
from gateway_server.engine.handoff import KvHandoff
from gateway_server.engine.sim.sampling import Sampler
from hangup_contract.cancel_labels import Phase


@dataclass(eq=False)
class Sequence:
    request: EngineRequest
    prompt_tokens: int
    sampler: Sampler
    stop_ids: frozenset[int] = frozenset()
    """``stop_token_ids`` as a set (:class:`~.sampling.Prepared`): one lookup a token."""
    out: asyncio.Queue[TokenChunk | EngineDead] = field(default_factory=asyncio.Queue)
    prefilled: int = 0
    generated: int = 0
    tail: str = ""
    """The end of the text so far that a stop string may still complete: one character less
    than the longest stop string (nothing without stop strings)."""
    phase: Phase = Phase.QUEUED
    finished: bool = False
    save_as: str | None = None
    """Prefill only: keep the prompt's KV under this key once read, then end."""
    handoff: KvHandoff | None = None
    """Decode: the prompt's KV comes from this handoff (phase ``transfer`` until loaded)."""
    transfer_done_at: float = 0.0

    @property
    def held_tokens(self) -> int:
        return self.prefilled + self.generated

    def cut_at_stop(self, text: str, search: bool) -> tuple[str, FinishReason | None]:
        """The new token's ``text`` up to the first stop string it completes (or to that
        string's end with ``include_stop_str_in_output``), and STOP when one was found; only
        where ``search`` (``min_tokens`` reached). As vLLM's stop checker, only text the token
        completes is searched: a token costs its text's and the stop strings' length, never
        the answer's."""
        params = self.request.params
        window = self.tail + text
        if search:
            for stop in params.stop:
                at = window.find(stop, max(0, len(self.tail) - len(stop) + 1)) if stop else -1
                if at >= 0:
                    end = at + len(stop) if params.include_stop_str_in_output else at
                    return text[: max(0, end - len(self.tail))], FinishReason.STOP
        keep = max(map(len, params.stop)) - 1
        self.tail = window[len(window) - keep :] if keep > 0 else ""
        return text, None
