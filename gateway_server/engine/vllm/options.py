"""Command-line options for the vLLM engine; importing this module does not import vLLM.

Each option maps one-to-one onto a field of vLLM's ``AsyncEngineArgs`` (same name, same meaning),
so a user who knows ``vllm serve`` knows these. ``None`` leaves vLLM's own default in place.
(``--seed`` is the gateway's shared flag; vLLM keeps its own default seed.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hangup_contract.runtime.options import Option, byte_size, count, fraction, parse_bool


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
    kv_connector: str = "hangup"
    """The KV connector of a disaggregated gateway's workers (``--worker-roles``): ``hangup``
    (hangup's own, file-based, one machine) or ``NixlConnector`` (vLLM's, GPUs); not an
    ``AsyncEngineArgs`` field, and unused by aggregated serving."""

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


VLLM_OPTIONS = (
    Option("--dtype", str, "weights and activations dtype", group="vllm", metavar="DTYPE"),
    Option(
        "--max-model-len",
        count,
        "context length (prompt + output tokens)",
        group="vllm",
        unset="the model's",
    ),
    Option(
        "--max-num-seqs",
        count,
        "requests in one batch; more wait in vLLM's queue",
        group="vllm",
        unset="vLLM's",
    ),
    Option("--gpu-memory-utilization", fraction, "share of GPU memory vLLM may use", group="vllm"),
    Option("--tensor-parallel-size", count, "GPUs per worker", group="vllm"),
    Option("--enforce-eager", parse_bool, "skip graph capture and compilation", group="vllm"),
    Option(
        "--max-num-batched-tokens",
        count,
        "token budget of one engine step",
        group="vllm",
        unset="vLLM's",
    ),
    Option(
        "--kv-cache-memory-bytes",
        byte_size,
        "KV-cache size per worker (overrides --gpu-memory-utilization; on a CPU, of its memory)",
        group="vllm",
        unset="vLLM's (from `--gpu-memory-utilization`)",
    ),
    Option(
        "--enable-prefix-caching",
        parse_bool,
        "reuse KV blocks of shared prefixes",
        group="vllm",
        unset="vLLM's",
    ),
    Option(
        "--kv-connector",
        str,
        "KV connector between prefill and decode workers (--worker-roles): hangup (file-based, "
        "this machine) or NixlConnector (GPUs)",
        group="vllm",
        metavar="NAME",
    ),
)
"""The vLLM engine's options, each named as in ``vllm serve`` and ``AsyncEngineArgs``."""
