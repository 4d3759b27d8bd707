"""The simulated engine's settings (its ``--sim-*`` flags: :mod:`.options`), checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from hangup_contract.runtime.options import ConfigError


@dataclass(frozen=True, slots=True)
class SimConfig:
    slots: int = 8
    max_model_len: int = 4096
    step_base_s: float = 0.01
    step_per_seq_s: float = 0.0005
    prefill_per_token_s: float = 0.00002
    prefill_chunk_tokens: int = 512
    seed: int = 0
    transfer_per_block_s: float = 0.0005
    """P/D: seconds a decode engine takes to load one block of a prompt's KV."""
    kv_lease_s: float = 30.0
    """P/D: seconds a prefill engine keeps a prompt's KV that nobody pulled or released."""

    def __post_init__(self) -> None:
        if self.slots < 1 or self.prefill_chunk_tokens < 1:
            raise ConfigError("--sim-slots and --sim-prefill-chunk must be at least 1")


SIM_BLOCK_SIZE = 16
"""Tokens per simulated KV-cache block (vLLM's default on GPUs): the simulation holds every
running sequence's tokens, ``slots * max_model_len`` of them, and reports them as blocks."""
