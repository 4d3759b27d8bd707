"""The admin and dev-only routes of each server a cancel adapter fronts: what the sidecar refuses
from clients unless an operator opens a path (``--allow-admin-path``; ``proxy.calls.admin_paths``
matches them).

A route is a pattern: a path of literal segments, ``*`` for any one segment, and ``**`` last for
the rest of the path (none or more segments). Patterns are written lower-case; gRPC methods are
``/package.Service/Method`` lower-cased. Each belongs to a :class:`Rule`, which a refusal names.
Read from each server's own source (docs/security.md says which versions and what the real
servers showed):

- ``vllm`` (``vllm serve``, vLLM 0.32's ``vllm/entrypoints``): what ``VLLM_SERVER_DEV_MODE=1``
  adds (cache resets, ``collective_rpc``, ``server_info``, sleep and wake, and the RL routes:
  pause, resume, ``abort_requests``, weight updates), runtime LoRA loading
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, SageMaker's ``/adapters`` too), the profiler, elastic
  expert parallelism, fault tolerance, the scale-out API's abort by id, and the cancel by id of
  vLLM PR 55521 (``/v1/requests/...``, open: not in 0.32), which any holder of vLLM's API key
  could call for any request. With its token the sidecar answers those paths itself
  (``proxy.http.cancel_api``), before this refusal.
- ``sglang``: ``/abort_request`` (any rid by prefix, or all) and its control routes: cache
  flushes, profiling, weight and LoRA updates, memory release, logging, internal state, pause,
  and the server-info dumps (its server arguments, the API key among them).
- ``triton``: the API groups Triton's own ``--http-restricted-api`` names for operators:
  model repository (index, load, unload: a load can run a model's code), shared memory (system
  and CUDA: a registered region is memory of the server's host), trace and logging settings
  (files written on the server), HTTP and gRPC alike.
- ``hangup``: the gateway's own ``/v2/admin/...`` (the simulated engine's fault switch). Its
  cancel API and ``GET /v2/requests`` stay, behind the token.
- ``none`` fronts a server the proxy does not know (Truss, or any other): every route above, and
  Truss's own (``/hot-reload``; its live-reload control server's ``/control/...``).

Metrics and health stay reachable: none of them is listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    """Why a route is refused: its ``name`` (a refusal's words and a metric label) and what it
    is, for the refusal's message."""

    name: str
    what: str


@dataclass(frozen=True, slots=True)
class AdminRoutes:
    """The routes refused in front of one server: HTTP path patterns and gRPC methods."""

    http: tuple[tuple[str, Rule], ...] = ()
    grpc: tuple[tuple[str, Rule], ...] = ()

    def __add__(self, other: AdminRoutes) -> AdminRoutes:
        return AdminRoutes(self.http + other.http, self.grpc + other.grpc)


def _rule(name: str, what: str, paths: Iterable[str]) -> tuple[tuple[str, Rule], ...]:
    rule = Rule(name, what)
    return tuple((path, rule) for path in paths)


VLLM = AdminRoutes(
    http=(
        *_rule("vllm-dev-mode", "a development endpoint of vLLM (VLLM_SERVER_DEV_MODE=1)", (
            "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc",
            "/server_info", "/sleep", "/wake_up", "/is_sleeping", "/release_kv_cache_memory",
        )),
        *_rule("vllm-rl", "an RL endpoint of vLLM (VLLM_SERVER_DEV_MODE=1): abort, pause, "
               "weights", (
            "/abort_requests", "/pause", "/resume", "/is_paused", "/init_weight_transfer_engine",
            "/shutdown_weight_transfer_engine", "/start_weight_update",
            "/start_draft_weight_update", "/update_weights", "/finish_weight_update",
            "/update_weight_version", "/weight_info", "/weight_checker", "/get_world_size",
        )),
        *_rule("vllm-lora", "vLLM's runtime LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING)", (
            "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/adapters/*",
        )),
        *_rule("vllm-profiler", "vLLM's profiler (--profiler-config)", (
            "/start_profile", "/stop_profile",
        )),
        *_rule("vllm-elastic-ep", "vLLM's elastic expert parallelism", (
            "/scale_elastic_ep", "/is_scaling_elastic_ep",
        )),
        *_rule("vllm-fault-tolerance", "vLLM's fault tolerance (--enable-fault-tolerance)", (
            "/fault_tolerance/**",
        )),
        *_rule("vllm-scale-out-abort", "vLLM's scale-out abort by id (--enable-scale-out)", (
            "/inference/v1/abort_requests",
        )),
        *_rule("vllm-cancel", "vLLM PR 55521's cancel by id (open; any holder of vLLM's API "
               "key may cancel any request: the sidecar answers these paths itself, with its "
               "token)", ("/v1/requests/**",)),
    ),
)  # fmt: skip

SGLANG = AdminRoutes(
    http=(
        *_rule("sglang-abort", "SGLang's abort by rid prefix, or of every request", (
            "/abort_request",
        )),
        *_rule("sglang-admin", "an admin endpoint of SGLang", (
            "/flush_cache", "/clear_hicache_storage_backend", "/start_profile", "/stop_profile",
            "/freeze_gc", "/start_expert_distribution_record", "/stop_expert_distribution_record",
            "/dump_expert_distribution_record", "/update_weights", "/update_weights_from_disk",
            "/update_weights_from_tensor", "/update_weights_from_distributed",
            "/update_weights_from_ipc", "/update_weight_version", "/init_weights_update_group",
            "/destroy_weights_update_group", "/init_weights_send_group_for_remote_instance",
            "/send_weights_to_remote_instance", "/get_weights_by_name",
            "/release_memory_occupation", "/resume_memory_occupation", "/slow_down",
            "/load_lora_adapter", "/unload_lora_adapter", "/configure_logging",
            "/set_internal_state", "/pause_generation", "/continue_generation",
            "/get_server_info", "/server_info", "/get_server_args",
        )),
    ),
)  # fmt: skip

_TRITON = "/inference.grpcinferenceservice/"
TRITON = AdminRoutes(
    http=(
        *_rule("triton-model-repository", "Triton's model repository API (index, load, "
               "unload)", ("/v2/repository/**",)),
        *_rule("triton-shared-memory", "Triton's shared-memory API", (
            "/v2/systemsharedmemory/**", "/v2/cudasharedmemory/**",
        )),
        *_rule("triton-trace", "Triton's trace settings", (
            "/v2/trace/setting", "/v2/models/*/trace/setting",
            "/v2/models/*/versions/*/trace/setting",
        )),
        *_rule("triton-logging", "Triton's log settings", ("/v2/logging",)),
    ),
    grpc=(
        *_rule("triton-model-repository", "Triton's model repository API (index, load, "
               "unload)", (
            _TRITON + "repositoryindex", _TRITON + "repositorymodelload",
            _TRITON + "repositorymodelunload",
        )),
        *_rule("triton-shared-memory", "Triton's shared-memory API", (
            _TRITON + "systemsharedmemorystatus", _TRITON + "systemsharedmemoryregister",
            _TRITON + "systemsharedmemoryunregister", _TRITON + "cudasharedmemorystatus",
            _TRITON + "cudasharedmemoryregister", _TRITON + "cudasharedmemoryunregister",
        )),
        *_rule("triton-trace", "Triton's trace settings", (_TRITON + "tracesetting",)),
        *_rule("triton-logging", "Triton's log settings", (_TRITON + "logsettings",)),
    ),
)  # fmt: skip

TRUSS = AdminRoutes(
    http=_rule("truss-reload", "Truss's code reload (its live-reload control server)", (
        "/hot-reload", "/control/**",
    )),
)  # fmt: skip

GATEWAY = AdminRoutes(
    http=_rule("hangup-admin", "the gateway's admin API (the simulated engine's fault switch)", (
        "/v2/admin/**",
    )),
)  # fmt: skip

BY_ADAPTER = {
    "hangup": GATEWAY,
    "vllm": VLLM,
    "sglang": SGLANG,
    "triton": TRITON,
    "none": VLLM + SGLANG + TRITON + TRUSS + GATEWAY,
}
"""The routes refused with each ``--cancel-adapter``, by its name."""
