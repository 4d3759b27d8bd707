"""Command-line options for the vLLM engine; importing this module does not import vLLM."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EnvLookup = Callable[[str, Any], Any]
"""``env(name, default)``: the value of ``HANGUP_GATEWAY_<NAME>``, else ``default``."""


@dataclass(frozen=True, slots=True)
class VllmOptions:
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> VllmOptions:
        return cls(
            dtype=ns.dtype,
            max_model_len=ns.max_model_len,
            max_num_seqs=ns.max_num_seqs,
            gpu_memory_utilization=ns.gpu_memory_utilization,
            tensor_parallel_size=ns.tensor_parallel_size,
            enforce_eager=ns.enforce_eager,
        )


def add_vllm_arguments(parser: argparse.ArgumentParser, env: EnvLookup) -> None:
    """Add the vLLM engine options; ``env(name, default)`` reads ``HANGUP_GATEWAY_<NAME>``."""
    group = parser.add_argument_group("vLLM engine (--engine vllm)")
    group.add_argument("--dtype", default=env("dtype", "auto"))
    group.add_argument("--max-model-len", type=int, default=env("max_model_len", None))
    group.add_argument("--max-num-seqs", type=int, default=env("max_num_seqs", None))
    group.add_argument(
        "--gpu-memory-utilization", type=float, default=env("gpu_memory_utilization", 0.9)
    )
    group.add_argument("--tensor-parallel-size", type=int, default=env("tensor_parallel_size", 1))
    group.add_argument(
        "--enforce-eager",
        action="store_true",
        default=env("enforce_eager", False) in (True, "1", "true"),
    )
