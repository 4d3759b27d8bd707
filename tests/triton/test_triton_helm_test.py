"""`helm test` for the triton preset against the real Triton 2.51: the chart's rendered test pod
(tests/support/helm_test_pod.py) calls the streamer's ``generate`` through the sidecar, not
streamed, and hangs up before the answer: the call Triton's HTTP frontend never cancels.

Triton's own metrics cannot show a cancellation of a decoupled model: it counts the request a
success when ``execute`` returns, before the model has run (checked here), so the preset's
default reads only the sidecar; a model of one's own exports what it runs (the streamer's
``streamer_requests_running``, a custom metric; Triton's vLLM backend exports vLLM's gauges), and
`helm test` reads it from Triton's metrics port. It passes through the bridge
(``--cancel-adapter triton``: the call is carried over gRPC and cancelled) and fails through a
sidecar that relays HTTP as it is (``none``: Triton's HTTP frontend never sees the hang-up of a
call not streamed, Triton 7077; a stream it notices at its next write). The dashboard's Triton
row reads metrics this Triton exports, with their labels, and every query of it returns data
from a real Prometheus scraping this Triton.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from typing import Any

import pytest

from bench.base.addresses import host_port
from bench.base.processes import Process
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.triton.server import TritonServer, install
from bench.harness.unavailable import Unavailable
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

pytestmark = pytest.mark.slow

VALUES: dict[str, Any] = {
    "server": "triton",
    "modelServer": {"image": "nvcr.io/nvidia/tritonserver:24.10-py3"},
    # 2,000 tokens of 50 ms: 100 s of streaming, far past the 5 s the gauge has to fall.
    "test": {"model": "streamer", "maxTokens": 2000, "timeoutSeconds": 15,
             "serverInflight": ["streamer_requests_running"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def release() -> Release:
    return rendered(None, VALUES)


def metrics_url(triton: TritonServer) -> str:
    return f"http://{triton.metrics}/metrics"


def test_passes_through_the_bridge(
    release: Release, triton: TritonServer, triton_bridge: Process
) -> None:
    done = run_helm_test(release, triton_bridge.url("http"), triton_bridge.url("admin"),
                         server_metrics=metrics_url(triton))  # fmt: skip
    assert passed(done), done.stdout + done.stderr
    assert "streamer_requests_running" in done.stdout


def test_fails_where_http_is_relayed_as_it_is(
    release: Release, triton: TritonServer, triton_proxy: Process
) -> None:
    done = run_helm_test(release, triton_proxy.url("http"), triton_proxy.url("admin"),
                         server_metrics=metrics_url(triton))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "did not reach the server" in done.stderr, done.stderr


def test_triton_counts_a_decoupled_request_before_it_ends(triton: TritonServer) -> None:
    """Why the preset reads no Triton metric by default: a streamer request still streaming is
    already a success in nv_inference_request_success."""
    before = total(scrape(f"http://{triton.metrics}"), "nv_inference_request_success_total",
                   model="streamer")  # fmt: skip
    host, port = host_port(triton.http)
    params = json.dumps({"max_tokens": 200})
    body = json.dumps({"text_input": "x", "stream": True, "sampling_parameters": params}).encode()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/streamer/generate_stream HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))  # fmt: skip
        seen = b""
        while b"data:" not in seen:  # the head may come alone, the first event after it
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            samples = scrape(f"http://{triton.metrics}")
            if total(samples, "nv_inference_request_success_total", model="streamer") > before:
                break
            time.sleep(0.1)  # polling Triton's metrics, with a deadline
        # Still streaming (200 tokens of 50 ms), yet counted a success.
        assert total(samples, "nv_inference_request_success_total", model="streamer") > before
        assert total(samples, "streamer_requests_running") >= 1


def test_the_dashboards_triton_row_reads_what_triton_exports(triton: TritonServer) -> None:
    with urllib.request.urlopen(metrics_url(triton), timeout=10) as resp:
        text = resp.read().decode()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    labels = {line.split("{")[0]: line for line in text.splitlines() if "{" in line}
    used = set().union(*(server_metric_names(q.expr, "nv_") for q in panel_queries(rows=(4,))))
    assert used and all(exported(n, families) for n in used), sorted(used - families)
    for name in used:
        assert 'model="' in labels[name], labels[name]
    assert 'reason="CANCELED"' in text  # the failure reasons the row splits by


def test_every_query_of_the_triton_row_returns_data(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A real Prometheus scrapes this Triton's metrics port (with the labels Kubernetes discovery
    adds) while short calls run: each query of the dashboard's Triton row returns a number."""
    if prometheus_binary() is None:
        raise Unavailable("prometheus not found: `make k8s-tools` installs Debian's prometheus")
    labels = {"pod": "triton-0", "namespace": "triton"}
    target = Target("triton", triton.metrics, labels)
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), [target], []) as prometheus:
        host, port = host_port(triton.http)
        params = json.dumps({"max_tokens": 2, "step_s": 0.02})
        body = json.dumps({"text_input": "x", "sampling_parameters": params}).encode()
        up = {"triton": 1.0}
        poll_until(lambda: prometheus.targets_up() == up, 60, "the target scraped", interval=0.2)
        deadline = time.monotonic() + 5  # calls across several 1 s scrapes
        while time.monotonic() < deadline:
            request = urllib.request.Request(f"http://{host}:{port}/v2/models/streamer/generate",
                                             data=body, method="POST")  # fmt: skip
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
        exprs = row_exprs((4,))
        assert len(exprs) >= 5
        wait_all_return_data(prometheus, exprs)


def test_the_presets_flags_are_tritons(release: Release) -> None:
    """The server container's flags (address, ports, metrics) are flags of tritonserver 2.51."""
    found = install()
    assert not isinstance(found, str), found
    done = subprocess.run([str(found.server), "--help"], capture_output=True, text=True,
                          env=found.env, timeout=60, check=False)  # fmt: skip
    help_text = done.stdout + done.stderr
    (deployment,) = [o for o in release.objects() if o["kind"] == "Deployment"]
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "triton"]  # fmt: skip
    assert server["command"] == ["tritonserver"]
    for arg in server["args"]:
        assert f"{arg.split('=')[0]} <" in help_text or arg.split("=")[0] in help_text, arg
