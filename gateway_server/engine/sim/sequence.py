"""One request inside the simulated engine: where it is, what it generated, where it goes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway_server.engine.base import EngineDead, EngineRequest, FinishReason, TokenChunk
from gateway_server.engine.handoff import KvHandoff
from gateway_server.engine.sim.sampling import Sampler
from hangup_contract.vocabulary import Phase


@dataclass(eq=False)
class Sequence:
    request: EngineRequest
    prompt_tokens: int
    sampler: Sampler
    out: asyncio.Queue[TokenChunk | EngineDead] = field(default_factory=asyncio.Queue)
    prefilled: int = 0
    generated: int = 0
    text: str = ""
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

    def cut_at_stop(self, text: str) -> tuple[str, FinishReason | None]:
        """The token's text up to the first stop string (or to its end with
        ``include_stop_str_in_output``), and STOP when one was found."""
        for stop in self.request.params.stop:
            if stop and stop in self.text:
                end = self.text.index(stop)
                if self.request.params.include_stop_str_in_output:
                    end += len(stop)
                return text[: max(0, len(text) - (len(self.text) - end))], FinishReason.STOP
        return text, None
