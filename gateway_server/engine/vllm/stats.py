"""vLLM's per-step scheduler statistics, as the gateway reads them (no vLLM import at load).

vLLM hands every engine step's statistics to its stat loggers, in the event loop (AsyncLLM's
output handler). The gateway registers one that copies what it needs into a
:class:`SchedulerSnapshot`: requests running and waiting, KV-cache use, and a step count (phases
are inferred from it, see ``gateway_server.engine.vllm.engine``).

That logger takes the place of vLLM's Prometheus logger (vLLM adds its own unless one given is a
``PrometheusStatLogger``): the gateway exports the model-server metrics itself
(:mod:`gateway_server.metrics.pool`) from its own registry, so vLLM's would be updated every
step, for every request, and never read. :func:`scheduler_statistics_only` turns off vLLM's
per-request statistics in this process for the same reason. What the two save per streamed
token: docs/benchmarks-log.md (2026-11-23).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(slots=True)
class SchedulerSnapshot:
    """The latest per-step statistics of one engine core (written by its stat logger)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    steps: int = 0
    """Statistics received so far (one per engine step)."""
    on_step: Callable[[], None] | None = None
    """Called after each step's statistics were copied in (in the event loop)."""


def stat_logger_factory(snapshot: SchedulerSnapshot) -> Any:
    """A vLLM stat-logger factory that copies each step's scheduler statistics into ``snapshot``,
    in place of vLLM's Prometheus logger (see the module docstring).

    ``record`` runs in the event loop (AsyncLLM's output handler), once per engine step.
    """
    loggers: Any = import_module("vllm.v1.metrics.loggers")

    class _SnapshotLogger(loggers.PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: Any = None) -> None:
            pass  # none of vLLM's metrics: the gateway exports its own

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            snapshot.running = scheduler_stats.num_running_reqs
            # vLLM splits its waiting requests in two (deferred ones apart); both wait.
            snapshot.waiting = scheduler_stats.num_waiting_reqs + getattr(
                scheduler_stats, "num_skipped_waiting_reqs", 0
            )
            snapshot.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            snapshot.steps += 1
            if snapshot.on_step is not None:
                snapshot.on_step()

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return _SnapshotLogger


def scheduler_statistics_only(llm: Any) -> None:
    """Stop ``llm`` (an ``AsyncLLM`` not yet serving) from computing per-request statistics in
    this process; the engine core still sends its scheduler statistics every step (it was
    started with statistics on, as a stat logger was given). Another vLLM without these
    attributes keeps its statistics: slower, never wrong."""
    processor: Any = getattr(llm, "output_processor", None)
    if hasattr(llm, "log_stats") and hasattr(processor, "log_stats"):
        llm.log_stats = False
        processor.log_stats = False
