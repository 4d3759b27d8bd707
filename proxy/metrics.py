"""The proxy's Prometheus metrics (names are interface, see docs/proxy.md), on a registry passed in.

Label values come only from enums (``proxy.labels``, the connection close reasons), the
configured adapter name and the listener names, never from request ids. Durations are measured
with ``time.monotonic()`` by the callers.

What every call updates (calls in flight, calls finished, the upstream's first byte) is counted
in plain numbers and written to the metrics in batches (:class:`_PerCall`): each
prometheus_client update takes a lock and a chain of calls, and the four a call made were 7 % of
a short call's CPU. A collection (a scrape, ``get_sample_value``) writes what is pending first,
so a one-process proxy exports every call up to the scrape. A ``--workers`` worker's metrics
files are read without it collecting: it writes them every ``FLUSH_EVERY_S`` seconds (``Server``)
and whenever no call is in flight (:meth:`ProxyMetrics.quiet`).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import ENTRY_STATES, CancelKind
from hangup_contract.usage import Usage
from proxy.labels import CallProtocol, CancelResult, Outcome, Stage, TokenKind

FLUSH_EVERY_S = 0.5
HISTOGRAM_PARTS = ("_upper_bounds", "_buckets", "_sum")  # a Histogram's, batched into

# From 100 µs (a cancel on loopback) up to tens of seconds (a slow first byte from a long queue).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class ProxyMetrics:
    """Every metric the proxy exports; built once at startup and passed down."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        registry.register(_FlushFirst(self))  # before the metrics: a collection sees every call
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
        self.admin_refusals = Counter(
            "hangup_proxy_admin_refusals",
            "Calls refused because they named an admin route of the server behind (403, gRPC "
            "PERMISSION_DENIED; --allow-admin-path opens one), by protocol and rule.",
            ["protocol", "rule"],
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
        self.cancel_api = Counter(
            "hangup_proxy_cancel_api_calls",
            "Calls of the proxy's own cancel API answered, by what they named: one id (single), "
            "a group (group), a batch of ids (batch).",
            ["kind"],
            registry=registry,
        )
        self.cancel_api_ids = Counter(
            "hangup_proxy_cancel_api_ids",
            "Ids the proxy's cancel API answered for, by the kind of call and what it found of "
            "each: cancelled, finished, not_found.",
            ["kind", "state"],
            registry=registry,
        )
        for kind in CancelKind:
            self.cancel_api.labels(kind.value)
            for state in ENTRY_STATES:
                self.cancel_api_ids.labels(kind.value, state)
        self._add_cancelled_relays(registry)
        self.connections_closed = connections_closed(registry)
        self.event_loop_stalls = Counter(
            "hangup_proxy_event_loop_stalls",
            "Stalls of the event loop longer than --loop-stall-log (each logged with its stack).",
            registry=registry,
        )
        self._add_timings_and_gauges(registry)

    def _add_cancelled_relays(self, registry: CollectorRegistry) -> None:
        """What the proxy relayed of calls that ended cancelled (``cancelled_relay``)."""
        self.cancelled_bytes = Counter(
            "hangup_proxy_cancelled_bytes",
            "Response bytes relayed to clients of calls that ended cancelled, by why.",
            ["protocol", "reason"],
            registry=registry,
        )
        self.cancelled_chunks = Counter(
            "hangup_proxy_cancelled_chunks",
            "Pieces of answers relayed to clients of calls that ended cancelled (gRPC messages; "
            "HTTP body writes, one per upstream read), by why.",
            ["protocol", "reason"],
            registry=registry,
        )
        self.cancelled_usage_tokens = Counter(
            "hangup_proxy_cancelled_usage_tokens",
            "Tokens the server behind said a call that ended cancelled used (its own usage, "
            "where it sent one: a usage chunk or field relayed, hangup's trailing metadata), "
            "by why and which tokens.",
            ["protocol", "reason", "kind"],
            registry=registry,
        )
        for protocol in CallProtocol:
            for reason in Reason:
                self.cancelled_bytes.labels(protocol.value, reason.value)
                self.cancelled_chunks.labels(protocol.value, reason.value)
                for kind in TokenKind:
                    self.cancelled_usage_tokens.labels(protocol.value, reason.value, kind.value)

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
        self.held_ids = Gauge(
            "hangup_proxy_held_ids",
            "Ids the proxy holds: of calls in flight (live), of calls that ended (ended), "
            "tombstones (tombstone); updated every second.",
            ["kind"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.held_id_bytes = Gauge(
            "hangup_proxy_held_id_bytes",
            "Bytes of the ids the proxy holds, by kind as hangup_proxy_held_ids (what each id "
            "costs, its characters and its entries).",
            ["kind"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._per_call = _PerCall(self)
        # prometheus_client writes files when this is set (a --workers worker), at import time
        self._to_files = "PROMETHEUS_MULTIPROC_DIR" in os.environ

    def admitted(self, protocol: CallProtocol) -> None:
        """A call is in flight."""
        self._per_call.inflight[protocol] += 1

    def released(self, protocol: CallProtocol) -> None:
        self._per_call.inflight[protocol] -= 1

    def finished(self, protocol: CallProtocol, outcome: Outcome) -> None:
        ended = self._per_call.finished
        ended[protocol, outcome] = ended.get((protocol, outcome), 0) + 1

    def first_byte(self, seconds: float) -> None:
        """The upstream's answer began ``seconds`` after the call was sent."""
        self._per_call.first_byte(seconds)

    def flush(self) -> None:
        """Write the per-call updates made since the last flush to the metrics."""
        self._per_call.flush()

    def quiet(self) -> None:
        """No call is in flight. A ``--workers`` worker flushes now: its metrics files are read
        without it collecting, and this way they hold every call whenever it is idle (between
        two bursts, after a test's calls), not only every ``FLUSH_EVERY_S``."""
        if self._to_files:
            self._per_call.flush()

    def held(self, sizes: dict[str, tuple[int, int]]) -> None:
        """The ids held, by kind: how many, and their bytes (``HeldCalls.sizes``)."""
        for kind, (count, size) in sizes.items():
            self.held_ids.labels(kind).set(count)
            self.held_id_bytes.labels(kind).set(size)

    def disconnected(self, protocol: CallProtocol, stage: Stage) -> None:
        self.client_disconnects.labels(protocol.value, stage.value).inc()

    def cancelled(self, protocol: CallProtocol, reason: Reason) -> None:
        self.cancel_reasons.labels(protocol.value, reason.value).inc()

    def cancel_answered(self, kind: CancelKind, states: Iterable[str]) -> None:
        """One call of the cancel API, and the state of each id it answered for."""
        self.cancel_api.labels(kind.value).inc()
        for state in states:
            if state in ENTRY_STATES:
                self.cancel_api_ids.labels(kind.value, state).inc()

    def cancelled_relay(
        self,
        protocol: CallProtocol,
        reason: Reason,
        relayed: tuple[int, int],
        usage: Usage | None,
    ) -> None:
        """What was relayed of a call that ended cancelled for ``reason``: ``relayed`` (bytes,
        chunks), and the server's own usage, where it sent one."""
        size, chunks = relayed
        if size:
            self.cancelled_bytes.labels(protocol.value, reason.value).inc(size)
        if chunks:
            self.cancelled_chunks.labels(protocol.value, reason.value).inc(chunks)
        if usage is not None:
            for kind, tokens in (
                (TokenKind.PROMPT, usage.prompt_tokens),
                (TokenKind.COMPLETION, usage.completion_tokens),
            ):
                if tokens:
                    self.cancelled_usage_tokens.labels(
                        protocol.value, reason.value, kind.value
                    ).inc(tokens)

    def admin_refused(self, protocol: CallProtocol, rule: str) -> None:
        self.admin_refusals.labels(protocol.value, rule).inc()

    def cancel_call(self, adapter: str, result: CancelResult, seconds: float | None) -> None:
        self.cancel_calls.labels(adapter, result.value).inc()
        if seconds is not None:
            self.disconnect_to_cancel.observe(seconds)


class _PerCall:
    """The per-call updates not yet in the metrics, as plain numbers: made and flushed on the
    event loop's thread, so no lock."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics
        self.inflight = dict.fromkeys(CallProtocol, 0)  # calls admitted less calls released
        self.finished: dict[tuple[CallProtocol, Outcome], int] = {}
        self._inflight_of = {p: metrics.inflight.labels(p.value) for p in CallProtocol}
        self._requests: dict[tuple[CallProtocol, Outcome], Counter] = {}  # made when first used
        ttfb = metrics.upstream_ttfb
        # Observations go to their bucket here and are added to the histogram's own bucket and
        # sum values when flushed, as ``Histogram.observe`` adds one (its attributes are not
        # public: without them, each is observed when flushed; tests/pure checks the two agree).
        self._batched = all(hasattr(ttfb, part) for part in HISTOGRAM_PARTS)
        self._bounds: list[float] = list(getattr(ttfb, "_upper_bounds", ()))
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._observed: list[float] = []  # without the attributes

    def first_byte(self, seconds: float) -> None:
        if self._batched:
            self._counts[bisect_left(self._bounds, seconds)] += 1
            self._sum += seconds
        else:
            self._observed.append(seconds)

    def flush(self) -> None:
        for protocol, delta in self.inflight.items():
            if delta:
                self.inflight[protocol] = 0
                self._inflight_of[protocol].inc(delta)
        finished, self.finished = self.finished, {}
        for key, count in finished.items():
            child = self._requests.get(key)
            if child is None:
                child = self._requests[key] = self._metrics.requests.labels(
                    key[0].value, key[1].value
                )
            child.inc(count)
        self._flush_first_bytes()

    def _flush_first_bytes(self) -> None:
        ttfb = self._metrics.upstream_ttfb
        observed, self._observed = self._observed, []
        for seconds in observed:
            ttfb.observe(seconds)
        if not any(self._counts):
            return
        counts, self._counts = self._counts, [0] * len(self._bounds)
        total, self._sum = self._sum, 0.0
        ttfb._sum.inc(total)
        for bucket, count in zip(ttfb._buckets, counts, strict=True):
            if count:
                bucket.inc(count)


class _FlushFirst:
    """Registered before the metrics: a collection of the registry flushes the per-call updates
    before it reads any metric. Exports nothing itself."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        self._metrics.flush()
        return ()


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
