"""Command-line options for the simulated engine (their values: :class:`.sim.SimConfig`)."""

from __future__ import annotations

from hangup_contract.runtime.options import Option

SIM_OPTIONS = (
    Option("--sim-slots", int, "batch slots", group="sim", field="slots"),
    Option("--sim-max-model-len", int, "context length", group="sim", field="max_model_len"),
    Option("--sim-step-base", float, "seconds per step", group="sim", field="step_base_s"),
    Option(
        "--sim-step-per-seq",
        float,
        "seconds per step per running sequence",
        group="sim",
        field="step_per_seq_s",
    ),
    Option(
        "--sim-prefill-per-token",
        float,
        "seconds per prompt token",
        group="sim",
        field="prefill_per_token_s",
    ),
    Option(
        "--sim-prefill-chunk",
        int,
        "prompt tokens prefilled per step",
        group="sim",
        field="prefill_chunk_tokens",
    ),
    Option(
        "--sim-transfer-per-block",
        float,
        "seconds to load one KV block from a prefill worker (--worker-roles)",
        group="sim",
        field="transfer_per_block_s",
    ),
    Option(
        "--sim-kv-lease",
        float,
        "seconds a prefill worker keeps KV nobody pulled (--worker-roles)",
        group="sim",
        field="kv_lease_s",
    ),
    Option("--seed", int, "seed of the simulated engine's text", group="sim"),
)
