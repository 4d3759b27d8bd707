"""End to end: a real Prometheus on loopback scrapes a live gateway and proxy while a workload
hangs up on purpose; every dashboard query and recording rule must then return data, and every
metric name they use must be one the running code exports.

The stack mirrors the chart: clients go through the proxy; Prometheus scrapes the proxy's admin
port, and the gateway's /metrics through the proxy's HTTP port (the gateway stays on loopback);
every series gets the `pod` and `namespace` labels Kubernetes discovery would add.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.base.processes import Process, spawn
from bench.base.waiting import poll_until
from bench.harness.unavailable import Unavailable
from tests.support.observability_files import RULES, PanelQuery, metric_names, panel_queries, rules
from tests.support.prometheus import (
    Prometheus,
    Target,
    prometheus_binary,
    running_prometheus,
    wait_all_return_data,
)

pytestmark = pytest.mark.slow

MODEL = "hangup-sim"
LABELS = {"pod": "hangup-e2e-0", "namespace": "e2e"}
# Per wave. Prometheus must scrape between waves: a labelled series created by the first wave
# needs later samples that differ before rate() sees it move.
HANGUPS, COMPLETIONS, EARLY_HANGUPS, WAVES = 6, 4, 2, 3

PROMETHEUS_POLL = 0.2
"""Seconds between looks at Prometheus (it evaluates on its own scrape interval)."""


@dataclass
class Stack:
    prometheus: Prometheus
    gateway_metrics_url: str
    front_url: str  # the proxy's HTTP address: where clients connect
    proxy_admin_url: str


async def stream_and_hang_up(session: aiohttp.ClientSession, url: str) -> None:
    """A long streamed completion; the client leaves after three events."""
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 4000, "stream": True}
    resp = await session.post(f"{url}/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    events = 0
    async for line in resp.content:
        events += line.startswith(b"data:")
        if events == 3:
            break
    resp.close()  # hang up: the connection is dropped, not returned to the pool


async def hang_up_before_response(session: aiohttp.ClientSession, url: str) -> None:
    """A long non-streamed completion whose client gives up before any byte of the answer."""
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 4000}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.3), session.post(f"{url}/v1/completions", json=body) as resp:
            await resp.read()
            raise AssertionError(f"answered {resp.status} before the client hung up")


async def complete(session: aiohttp.ClientSession, url: str) -> None:
    body = {"model": MODEL, "prompt": "a short one", "max_tokens": 16, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def refused(session: aiohttp.ClientSession, url: str) -> None:
    """An admin route of the gateway's, which the sidecar refuses (the dashboard counts it)."""
    async with session.post(f"{url}/v2/admin/faults", json={}) as resp:
        assert resp.status == 403, await resp.text()


async def workload(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            refused(session, url),
            *(stream_and_hang_up(session, url) for _ in range(HANGUPS)),
            *(hang_up_before_response(session, url) for _ in range(EARLY_HANGUPS)),
            *(complete(session, url) for _ in range(COMPLETIONS)),
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if prometheus_binary() is None:
        raise Unavailable("prometheus not found: `make k8s-tools` installs Debian's prometheus")
    tmp = tmp_path_factory.mktemp("e2e")
    token = tmp / "cancel-token"
    token.write_text(secrets.token_urlsafe(32))
    os.chmod(token, 0o600)
    with contextlib.ExitStack() as exits:
        gateway: Process = exits.enter_context(spawn(
            "gateway_server",
            ["--http-port", "0", "--grpc-port", "0", "--cancel-token-file", str(token)],
            tmp / "gateway",
        ))  # fmt: skip
        # Two workers, as the chart runs the proxy with a CPU limit: the metrics Prometheus
        # scrapes are the supervisor's sum of both.
        proxy_args = [
            "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
            "--admin-port", "0", "--upstream-http", gateway.url("http"),
            "--cancel-adapter", "hangup", "--cancel-token-file", str(token), "--workers", "2",
        ]  # fmt: skip
        if gateway.listeners.get("grpc"):  # None until the gateway serves gRPC
            proxy_args += ["--upstream-grpc", gateway.listeners["grpc"]]
        proxy: Process = exits.enter_context(spawn("proxy", proxy_args, tmp / "proxy"))
        front, admin = proxy.url("http"), proxy.url("admin")
        # As the chart has it: the gateway's metrics through the proxy's HTTP port.
        targets = [
            Target("hangup-gateway", proxy.listeners["http"], LABELS),
            Target("hangup-proxy", proxy.listeners["admin"], LABELS),
        ]
        prometheus = exits.enter_context(running_prometheus(tmp / "prometheus", targets, [RULES]))
        jobs = {t.job for t in targets}
        poll_until(lambda: prometheus.targets_up() == dict.fromkeys(jobs, 1.0), 60, "targets up",
                   interval=PROMETHEUS_POLL)  # fmt: skip
        seen = "sum(hangup_gateway_requests_total)"
        for wave in range(1, WAVES + 1):
            asyncio.run(workload(front))
            # Wait for a scrape that includes this wave: what the gateway counts now.
            now = sum_of(f"{front}/metrics", "hangup_gateway_requests_total")
            poll_until(
                lambda now=now: any(float(s["value"][1]) >= now for s in prometheus.query(seen)),
                60,
                f"Prometheus scraping wave {wave}",
                interval=PROMETHEUS_POLL,
            )
        yield Stack(prometheus, f"{front}/metrics", front, admin)


def needs_proxy(expr: str) -> bool:
    """Whether an expression reads the proxy's metrics (directly or through a recorded series)."""
    return ":proxy_" in expr or any(n.startswith("hangup_proxy_") for n in metric_names(expr))


def check_all_return_data(prometheus: Prometheus, exprs: dict[str, str]) -> None:
    wait_all_return_data(prometheus, exprs)


def panel_exprs(proxy: bool) -> dict[str, str]:
    """The queries of the rows the chart shows for the gateway (the sidecar's and the gateway's;
    the vLLM and Triton rows are checked against those servers, in their tiers)."""
    queries: list[PanelQuery] = panel_queries(rows=(1, 2))
    return {
        f"{q.panel} [{q.legend}] {q.expr}": q.promql()
        for q in queries
        if needs_proxy(q.expr) == proxy
    }


def rule_exprs(proxy: bool) -> dict[str, str]:
    return {
        r["record"]: r["record"]
        for r in rules()
        if "record" in r and needs_proxy(r["expr"]) == proxy
    }


def test_gateway_panels_return_data(stack: Stack) -> None:
    exprs = panel_exprs(proxy=False)
    assert len(exprs) >= 10
    check_all_return_data(stack.prometheus, exprs)


def test_gateway_recording_rules_return_data(stack: Stack) -> None:
    exprs = rule_exprs(proxy=False)
    assert len(exprs) >= 6
    check_all_return_data(stack.prometheus, exprs)


def test_proxy_panels_and_rules_return_data(stack: Stack) -> None:
    check_all_return_data(stack.prometheus, panel_exprs(proxy=True) | rule_exprs(proxy=True))


def test_dashboard_variables_find_the_namespace_pod_and_model(stack: Stack) -> None:
    assert MODEL in stack.prometheus.label_values("model", "hangup_gateway_requests_total")
    assert LABELS["pod"] in stack.prometheus.label_values("pod", "hangup_proxy_requests_total")
    assert LABELS["namespace"] in stack.prometheus.label_values(
        "namespace", "hangup_proxy_requests_total"
    )


def test_cancellations_reached_the_engine(stack: Stack) -> None:
    """The workload's hang-ups show up where the dashboard looks first."""
    by_reason = stack.prometheus.finite(
        'sum by (reason) (hangup_gateway_cancellations_total{reason="client_disconnect"})'
    )
    # Every streamed hang-up reached the gateway (the client had read events); a client that
    # gave up before its answer may have left before the proxy sent the request on.
    assert by_reason and float(by_reason[0]["value"][1]) >= WAVES * HANGUPS


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        return str(resp.read().decode())


def sum_of(metrics_url: str, sample_name: str) -> float:
    families = text_string_to_metric_families(scrape(metrics_url))
    return sum(s.value for f in families for s in f.samples if s.name == sample_name)


def exported_names(metrics_url: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(scrape(metrics_url)):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_name_used_is_exported_by_the_code(stack: Stack) -> None:
    used = set().union(*(metric_names(q.expr) for q in panel_queries()))
    used |= set().union(*(metric_names(r["expr"]) for r in rules()))
    gateway = {n for n in used if n.startswith("hangup_gateway_")}
    missing = gateway - exported_names(stack.gateway_metrics_url)
    assert not missing, f"the gateway does not export: {sorted(missing)}"
    proxy = {n for n in used if n.startswith("hangup_proxy_")}
    missing = proxy - exported_names(f"{stack.proxy_admin_url}/metrics")
    assert not missing, f"the proxy does not export: {sorted(missing)}"


def test_rules_file_is_the_one_prometheus_loaded(stack: Stack) -> None:
    loaded = stack.prometheus.api("rules")["groups"]
    assert {g["file"] for g in loaded} == {str(Path(RULES))}
