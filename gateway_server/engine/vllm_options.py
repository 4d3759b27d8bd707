"""Command-line options for the vLLM engine; importing this module does not import vLLM.

Each option maps one-to-one onto a field of vLLM's ``AsyncEngineArgs`` (same name, same meaning),
so a user who knows ``vllm serve`` knows these. ``None`` leaves vLLM's own default in place.
(``--seed`` is the gateway's shared flag; vLLM keeps its own default seed.)
"""

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
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step; a longer prompt is prefilled in chunks of this size."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache size per worker; overrides ``gpu_memory_utilization`` (on CPU: share of RAM)."""
    enable_prefix_caching: bool | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> VllmOptions:
        return cls(
            dtype=ns.dtype,
            max_model_len=ns.max_model_len,
            max_num_seqs=ns.max_num_seqs,
            gpu_memory_utilization=ns.gpu_memory_utilization,
            tensor_parallel_size=ns.tensor_parallel_size,
            enforce_eager=ns.enforce_eager,
            max_num_batched_tokens=ns.max_num_batched_tokens,
            kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
            enable_prefix_caching=ns.enable_prefix_caching,
        )

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.AsyncEngineArgs`` (model excluded); unset ones left out."""
        args: dict[str, Any] = {
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": self.enforce_eager,
        }
        optional = {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "enable_prefix_caching": self.enable_prefix_caching,
        }
        args.update({k: v for k, v in optional.items() if v is not None})
        return args


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _optional_flag(value: Any) -> bool | None:
    return None if value is None else _flag(value)


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
        "--enforce-eager", action="store_true", default=_flag(env("enforce_eager", False))
    )
    group.add_argument(
        "--max-num-batched-tokens", type=int, default=env("max_num_batched_tokens", None)
    )
    group.add_argument(
        "--kv-cache-memory-bytes", type=int, default=env("kv_cache_memory_bytes", None)
    )
    group.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=_optional_flag(env("enable_prefix_caching", None)),
    )
