"""The proxy's Prometheus metrics (names are interface, see docs/proxy.md), on a registry passed in.

Label values come only from enums (``proxy.vocabulary``, the connection close reasons), the
configured adapter name and the listener names, never from request ids. Durations are measured
with ``time.monotonic()`` by the callers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hangup_contract.vocabulary import Reason
from proxy.vocabulary import CallProtocol, CancelResult, Outcome, Stage

# From 100 µs (a cancel on loopback) up to tens of seconds (a slow first byte from a long queue).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class ProxyMetrics:
    """Every metric the proxy exports; built once at startup and passed down."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "hangup_proxy_requests",
            "Calls the proxy finished, by how they ended.",
            ["protocol", "outcome"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "hangup_proxy_client_disconnects",
            "Clients that left before their response ended, by what they had seen.",
            ["protocol", "stage"],
            registry=registry,
        )
        self.scrapes = Counter(
            "hangup_proxy_scrapes",
            "GET requests on --scrape-paths relayed upstream outside the call accounting, by "
            "the status answered.",
            ["status"],
            registry=registry,
        )
        self.cancel_calls = Counter(
            "hangup_proxy_cancel_calls",
            "Explicit upstream cancel calls, retries included, by their final result.",
            ["adapter", "result"],
            registry=registry,
        )
        self.cancel_reasons = Counter(
            "hangup_proxy_cancels",
            "Upstream calls the proxy cancelled, by why.",
            ["protocol", "reason"],
            registry=registry,
        )
        self.connections_closed = connections_closed(registry)
        self.event_loop_stalls = Counter(
            "hangup_proxy_event_loop_stalls",
            "Stalls of the event loop longer than --loop-stall-log (each logged with its stack).",
            registry=registry,
        )
        self._add_timings_and_gauges(registry)

    def _add_timings_and_gauges(self, registry: CollectorRegistry) -> None:
        self.disconnect_to_cancel = Histogram(
            "hangup_proxy_disconnect_to_cancel_seconds",
            "From detecting a hang-up to the upstream acknowledging the cancel call.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "hangup_proxy_inflight_requests",
            "Calls in flight through the proxy.",
            ["protocol"],
            registry=registry,
            multiprocess_mode="livesum",  # with --workers: summed over the live workers
        )
        self.upstream_ttfb = Histogram(
            "hangup_proxy_upstream_time_to_first_byte_seconds",
            "From sending a call upstream to its response headers arriving.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cancel_pool_members = Histogram(
            "hangup_proxy_cancel_pool_members",
            "Members of --cancel-pool asked by one cancel (each cancel is counted once).",
            buckets=(1, 2, 3, 4, 8, 16, 32, 64, 128),
            registry=registry,
        )
        self.cancels_pending = Gauge(
            "hangup_proxy_cancel_calls_pending",
            "Cancel calls waiting for a slot or an answer.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        # The children every call touches, made once (``labels`` locks and looks up each time).
        self.inflight_of = {p: self.inflight.labels(p.value) for p in CallProtocol}
        self._requests: dict[tuple[CallProtocol, Outcome], Counter] = {}  # made when first used

    def finished(self, protocol: CallProtocol, outcome: Outcome) -> None:
        child = self._requests.get((protocol, outcome))
        if child is None:
            child = self._requests[protocol, outcome] = self.requests.labels(
                protocol.value, outcome.value
            )
        child.inc()

    def disconnected(self, protocol: CallProtocol, stage: Stage) -> None:
        self.client_disconnects.labels(protocol.value, stage.value).inc()

    def cancelled(self, protocol: CallProtocol, reason: Reason) -> None:
        self.cancel_reasons.labels(protocol.value, reason.value).inc()

    def cancel_call(self, adapter: str, result: CancelResult, seconds: float | None) -> None:
        self.cancel_calls.labels(adapter, result.value).inc()
        if seconds is not None:
            self.disconnect_to_cancel.observe(seconds)


class SupervisorMetrics:
    """What the ``--workers`` supervisor exports of its own, beside its workers' metrics summed
    (``proxy.workers``): the workers serving, their restarts, the admin listener's closes, and
    the workers' metrics files a scrape skipped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge("hangup_proxy_workers", "Worker processes serving.", registry=registry)
        self.restarts = worker_restarts(registry)
        self.connections_closed = connections_closed(registry)
        self.files_skipped = Counter(
            "hangup_proxy_metrics_files_skipped",
            "Workers' metrics files a scrape could not read yet (a worker starting) and skipped.",
            registry=registry,
        )


def worker_restarts(registry: CollectorRegistry) -> Counter:
    """``hangup_proxy_worker_restarts_total``: exported in every mode (an alert reads it)."""
    return Counter(
        "hangup_proxy_worker_restarts",
        "Worker processes that exited and were started again.",
        registry=registry,
    )


def connections_closed(registry: CollectorRegistry) -> Counter:
    """``hangup_proxy_connections_closed_total{listener, reason}``, on every listener."""
    return Counter(
        "hangup_proxy_connections_closed",
        "Client connections the proxy closed or refused to hold, by listener and why.",
        ["listener", "reason"],
        registry=registry,
    )
