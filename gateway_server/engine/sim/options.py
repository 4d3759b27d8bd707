"""Command-line options for the simulated engine (their values: :class:`.sim.SimConfig`)."""

from __future__ import annotations

from hangup_contract.runtime.options import Option, count, seconds

SIM_OPTIONS = (
    Option("--sim-slots", count, "batch slots", group="sim", field="slots"),
    Option(
        "--sim-max-model-len",
        count,
        "context length (prompt + output tokens)",
        group="sim",
        field="max_model_len",
    ),
    Option("--sim-step-base", seconds, "seconds per step", group="sim", field="step_base_s"),
    Option(
        "--sim-step-per-seq",
        seconds,
        "seconds per step per running sequence",
        group="sim",
        field="step_per_seq_s",
    ),
    Option(
        "--sim-prefill-per-token",
        seconds,
        "seconds per prompt token",
        group="sim",
        field="prefill_per_token_s",
    ),
    Option(
        "--sim-prefill-chunk",
        count,
        "prompt tokens prefilled per step",
        group="sim",
        field="prefill_chunk_tokens",
    ),
    Option(
        "--sim-transfer-per-block",
        seconds,
        "seconds to load one KV block from a prefill worker (--worker-roles)",
        group="sim",
        field="transfer_per_block_s",
    ),
    Option(
        "--sim-kv-lease",
        seconds,
        "seconds a prefill worker keeps KV nobody pulled (--worker-roles)",
        group="sim",
        field="kv_lease_s",
    ),
    Option("--seed", count, "seed of the simulated engine's text", group="sim"),
)
