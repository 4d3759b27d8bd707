"""The gateway's Prometheus metrics. Their names are interface: dashboards and alerts depend on
them, and the Metrics table of docs/gateway.md documents each.

Built once at start-up on a registry that is passed in. Label values come from the vocabulary
enums and the configured model names, never from request ids. Gauges about what is in flight
and about engine load are computed at scrape time by collectors over the live state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol as TypingProtocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway_server.engine.handoff import DisaggregatedEngine
from gateway_server.engine.pool import EnginePool
from gateway_server.labels import Outcome, Protocol, Refusal
from hangup_contract.cancel_labels import Phase, Reason
from hangup_contract.jobs import ENTRY_STATES, CancelKind
from hangup_contract.usage import Usage


class HasName(TypingProtocol):
    @property
    def name(self) -> str: ...


# From 0.1 ms (what a cancel costs beyond a step boundary) to tens of seconds (a long prefill).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, models: Iterable[str]) -> None:
        self.registry = registry
        self.requests = Counter(
            "hangup_gateway_requests",
            "Engine requests by how they ended.",
            ["model", "protocol", "outcome"],
            registry=registry,
        )
        self.cancellations = Counter(
            "hangup_gateway_cancellations",
            "Engine requests cancelled, by why and where they were.",
            ["model", "reason", "phase"],
            registry=registry,
        )
        self.cancel_to_abort = Histogram(
            "hangup_gateway_cancel_to_abort_seconds",
            "From a cancel received to the engine confirming the abort.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cancel_to_freed = Histogram(
            "hangup_gateway_cancel_to_freed_seconds",
            "Disaggregated serving: from a cancel received to every leg aborted and the KV held "
            "between them released.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cancel_forward = Histogram(
            "hangup_gateway_cancel_forward_seconds",
            "With --api-processes: time a cancel spent asking a sibling process (one hop each).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.generated_tokens = Counter(
            "hangup_gateway_generated_tokens",
            "Output tokens generated.",
            ["model"],
            registry=registry,
        )
        self.wasted_tokens = Counter(
            "hangup_gateway_wasted_tokens",
            "Output tokens generated for engine requests that ended cancelled.",
            ["model"],
            registry=registry,
        )
        self._add_cancelled_usage(registry)
        self.connections_closed = Counter(
            "hangup_gateway_connections_closed",
            "Client connections the gateway closed or refused to hold, by why.",
            ["listener", "reason"],
            registry=registry,
        )
        self.calls_refused = Counter(
            "hangup_gateway_calls_refused",
            "Client calls a listener refused for a limit, by why (the first of each is logged).",
            ["listener", "reason"],
            registry=registry,
        )
        for refusal in Refusal:
            self.calls_refused.labels("grpc", refusal.value)
        self.engine_restarts = Counter(
            "hangup_gateway_engine_restarts",
            "Engines that died and were started again, by worker.",
            ["worker"],
            registry=registry,
        )
        self.cancel_api = Counter(
            "hangup_gateway_cancel_api_calls",
            "Calls of the cancel API answered, by what they named: one id (single), a group "
            "(group), a batch of ids (batch).",
            ["kind"],
            registry=registry,
        )
        self.cancel_api_ids = Counter(
            "hangup_gateway_cancel_api_ids",
            "Ids the cancel API answered for, by the kind of call and what it found of each: "
            "cancelled, finished, not_found.",
            ["kind", "state"],
            registry=registry,
        )
        self.event_loop_stalls = Counter(
            "hangup_gateway_event_loop_stalls",
            "Stalls of the event loop longer than --loop-stall-log (each logged with its stack).",
            registry=registry,
        )
        self._add_latencies(registry)
        for model in models:
            self._create_series(model)

    def _add_latencies(self, registry: CollectorRegistry) -> None:
        self.time_to_first_token = Histogram(
            "hangup_gateway_time_to_first_token_seconds",
            "From an engine request's arrival to its first output token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "hangup_gateway_inter_token_latency_seconds",
            "Time between output chunks of one engine request, per token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def cancel_answered(self, kind: CancelKind, states: Iterable[str]) -> None:
        """One call of the cancel API, and the state of each id it answered for."""
        self.cancel_api.labels(kind.value).inc()
        for state in states:
            if state in ENTRY_STATES:
                self.cancel_api_ids.labels(kind.value, state).inc()

    def _add_cancelled_usage(self, registry: CollectorRegistry) -> None:
        labels = ["model", "reason", "phase"]
        self.cancelled_prompt_tokens = Counter(
            "hangup_gateway_cancelled_prompt_tokens",
            "Prompt tokens of engine requests that ended cancelled (each prompt once, as OpenAI's "
            "usage counts it), by why and where they were cancelled.",
            labels,
            registry=registry,
        )
        self.cancelled_output_tokens = Counter(
            "hangup_gateway_cancelled_output_tokens",
            "Tokens the engine generated for engine requests that ended cancelled, delivered or "
            "not, by why and where they were cancelled.",
            labels,
            registry=registry,
        )
        self.cancelled_seconds = Counter(
            "hangup_gateway_cancelled_phase_seconds",
            "Seconds engine requests that ended cancelled spent in each phase (the phase label "
            "is where the time went), by why they were cancelled.",
            labels,
            registry=registry,
        )

    def count_cancelled(
        self, model: str, reason: Reason, phase: Phase, usage: Usage, seconds: dict[Phase, float]
    ) -> None:
        """What an engine request that ended cancelled in ``phase`` for ``reason`` consumed."""
        if usage.prompt_tokens:
            self.cancelled_prompt_tokens.labels(model, reason.value, phase.value).inc(
                usage.prompt_tokens
            )
        if usage.completion_tokens:
            self.cancelled_output_tokens.labels(model, reason.value, phase.value).inc(
                usage.completion_tokens
            )
        for spent, value in seconds.items():
            if value:
                self.cancelled_seconds.labels(model, reason.value, spent.value).inc(value)

    def create_worker_series(self, workers: Iterable[str]) -> None:
        """Every worker's restart count exists from the start (at 0)."""
        for worker in workers:
            self.engine_restarts.labels(worker)

    def count_engine_restart(self, worker: HasName) -> None:
        self.engine_restarts.labels(worker.name).inc()

    def _create_series(self, model: str) -> None:
        """Every series of ``model`` exists from the start: rates and alerts see zeros."""
        self.generated_tokens.labels(model)
        self.wasted_tokens.labels(model)
        self.cancel_to_abort.labels(model)
        self.cancel_to_freed.labels(model)
        self.time_to_first_token.labels(model)
        self.inter_token_latency.labels(model)
        for protocol in Protocol:
            for outcome in Outcome:
                self.requests.labels(model, protocol.value, outcome.value)
        for reason in Reason:
            for phase in Phase:
                for counter in (
                    self.cancellations,
                    self.cancelled_prompt_tokens,
                    self.cancelled_output_tokens,
                    self.cancelled_seconds,
                ):
                    counter.labels(model, reason.value, phase.value)
        for kind in CancelKind:
            self.cancel_api.labels(kind.value)
            for state in ENTRY_STATES:
                self.cancel_api_ids.labels(kind.value, state)


class InflightCollector(Collector):
    """``hangup_gateway_inflight_requests{model,phase}`` read from the live calls at scrape."""

    def __init__(
        self, models: Iterable[str], phases_in_flight: Callable[[], Iterable[tuple[str, Phase]]]
    ) -> None:
        self._models = tuple(models)
        self._source = phases_in_flight

    def collect(self) -> Iterator[Metric]:
        counts = {(m, p): 0 for m in self._models for p in Phase}
        for model, phase in self._source():
            counts[(model, phase)] = counts.get((model, phase), 0) + 1
        family = GaugeMetricFamily(
            "hangup_gateway_inflight_requests",
            "Engine requests in flight, by phase.",
            labels=["model", "phase"],
        )
        for (model, phase), n in counts.items():
            family.add_metric([model, phase.value], n)
        yield family


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's load as read at scrape time."""

    name: str
    up: bool
    running: int
    waiting: int
    kv: float
    kv_blocks: int
    block_size: int
    role: str = "both"
    handoff_blocks: int = 0
    """KV blocks held for disaggregated handoffs nobody pulled or released yet."""


def worker_loads(pool: EnginePool) -> list[WorkerLoad]:
    """Every worker's load in ``pool``, read now."""
    loads = []
    for worker in pool.workers:
        engine = worker.engine
        load = worker.load()  # idle while the worker is down, never its dead engine's last
        loads.append(
            WorkerLoad(
                worker.name,
                engine.alive,
                load.running,
                load.waiting,
                load.kv_cache_usage,
                load.kv_cache_blocks,
                load.block_size,
                worker.role.value,
                _handoff_blocks(engine) if engine.alive else 0,
            )
        )
    return loads


def _handoff_blocks(engine: object) -> int:
    return engine.handoff_blocks() if isinstance(engine, DisaggregatedEngine) else 0


class EngineLoadCollector(Collector):
    """Per-worker engine load: running / waiting requests, KV-cache usage, whether it is up."""

    def __init__(self, read: Callable[[], Iterable[WorkerLoad]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "hangup_gateway_engine_running_requests",
            "Requests the engine is running.",
            labels=["worker"],
        )
        waiting = GaugeMetricFamily(
            "hangup_gateway_engine_waiting_requests",
            "Requests waiting for an engine slot.",
            labels=["worker"],
        )
        kv = GaugeMetricFamily(
            "hangup_gateway_engine_kv_cache_usage_ratio",
            "Share of the KV cache in use (0-1).",
            labels=["worker"],
        )
        blocks = GaugeMetricFamily(
            "hangup_gateway_engine_kv_cache_blocks",
            "Blocks the KV cache holds (0 while unknown).",
            labels=["worker"],
        )
        up = GaugeMetricFamily(
            "hangup_gateway_worker_up", "1 while the engine worker is alive.", labels=["worker"]
        )
        held = GaugeMetricFamily(
            "hangup_gateway_engine_kv_blocks_held",
            "KV-cache blocks in use, by worker and its role (prefill, decode, both).",
            labels=["worker", "role"],
        )
        handoff = GaugeMetricFamily(
            "hangup_gateway_handoff_kv_blocks",
            "KV blocks a prefill worker holds for decode workers that have not loaded them.",
            labels=["worker"],
        )
        for load in self._read():
            running.add_metric([load.name], load.running)
            waiting.add_metric([load.name], load.waiting)
            kv.add_metric([load.name], load.kv)
            blocks.add_metric([load.name], load.kv_blocks)
            up.add_metric([load.name], 1.0 if load.up else 0.0)
            held.add_metric([load.name, load.role], round(load.kv * load.kv_blocks))
            handoff.add_metric([load.name], load.handoff_blocks)
        yield from (running, waiting, kv, blocks, up, held, handoff)


class HandoffCollector(Collector):
    """``hangup_gateway_handoffs_in_flight``: engine requests whose prompt's KV waits on the
    prefill side for the decode side (in ``transfer``), read from the live calls at scrape."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "hangup_gateway_handoffs_in_flight",
            "Disaggregated requests whose prompt's KV is held for a decode worker.",
        )
        family.add_metric([], self._count())
        yield family
