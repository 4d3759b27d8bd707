"""The per-call metrics counted in plain numbers and written in batches (``proxy.metrics``):
what a scrape reads is what one update per call would have exported, pending updates included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from proxy import metrics as proxy_metrics
from proxy.labels import CallProtocol, Outcome
from proxy.metrics import LATENCY_BUCKETS, ProxyMetrics

_SECONDS = st.floats(min_value=0.0, max_value=120.0, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(_SECONDS, max_size=40), st.integers(min_value=0, max_value=3), st.booleans())
def test_first_bytes_batched_export_what_observing_each_would(
    seconds: list[float], flushes: int, histogram_parts: bool
) -> None:
    """Bucket by bucket, count and sum, whether the registry is read once at the end or the
    updates are also flushed along the way (the periodic flush); and the same from a
    prometheus_client whose Histogram lacks the parts batched into (each observed at the flush)."""
    with pytest.MonkeyPatch.context() as patch:
        if not histogram_parts:
            patch.setattr(proxy_metrics, "HISTOGRAM_PARTS", ("_not_in_this_version",))
        metrics = ProxyMetrics(CollectorRegistry())
    direct_registry = CollectorRegistry()
    direct = Histogram(
        "hangup_proxy_upstream_time_to_first_byte_seconds",
        "direct",
        buckets=LATENCY_BUCKETS,
        registry=direct_registry,
    )
    for i, value in enumerate(seconds):
        metrics.first_byte(value)
        direct.observe(value)
        if flushes and i % (flushes + 1) == 0:
            metrics.flush()
    name = "hangup_proxy_upstream_time_to_first_byte_seconds"
    batched, each = _samples(metrics.registry, name), _samples(direct_registry, name)
    assert [s for s in batched if not s[0].endswith("_sum")] == [
        s for s in each if not s[0].endswith("_sum")
    ]
    (batched_sum,) = [s[2] for s in batched if s[0].endswith("_sum")]
    (each_sum,) = [s[2] for s in each if s[0].endswith("_sum")]
    assert batched_sum == pytest.approx(each_sum, rel=1e-12, abs=1e-12)  # added in another order


def test_a_scrape_sees_every_call_admitted_released_and_finished_before_it() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    for _ in range(3):
        metrics.admitted(CallProtocol.HTTP)
    metrics.released(CallProtocol.HTTP)
    metrics.admitted(CallProtocol.GRPC)
    metrics.finished(CallProtocol.HTTP, Outcome.COMPLETED)
    metrics.finished(CallProtocol.HTTP, Outcome.COMPLETED)
    metrics.finished(CallProtocol.GRPC, Outcome.CANCELLED)
    read = metrics.registry.get_sample_value
    assert read("hangup_proxy_inflight_requests", {"protocol": "http"}) == 2
    assert read("hangup_proxy_inflight_requests", {"protocol": "grpc"}) == 1
    completed = {"protocol": "http", "outcome": "completed"}
    assert read("hangup_proxy_requests_total", completed) == 2
    assert read("hangup_proxy_requests_total", {"protocol": "grpc", "outcome": "cancelled"}) == 1
    metrics.released(CallProtocol.HTTP)
    metrics.released(CallProtocol.HTTP)
    metrics.finished(CallProtocol.HTTP, Outcome.COMPLETED)
    text = generate_latest(metrics.registry).decode()  # a scrape, as the admin listener makes it
    assert 'hangup_proxy_inflight_requests{protocol="http"} 0.0' in text
    assert 'hangup_proxy_requests_total{outcome="completed",protocol="http"} 3.0' in text


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[str, str, float]]:
    return [
        (sample.name, sample.labels.get("le", ""), sample.value)
        for family in registry.collect()
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]
