"""`helm test` for the truss preset against Truss's own model server (truss 0.18.36): the chart's
rendered test pod (tests/support/helm_test_pod.py) calls the ``polling`` model's predict through
the sidecar and hangs up before the answer. Truss exports nothing of its own on /metrics; a model
may (``truss_model_calls_running``, which the Truss tier's models keep), and `helm test` reads it
through the sidecar's HTTP port. It passes where the sidecar's closed connection reaches Truss
(the model's ``is_disconnected()``) and fails behind a hop that swallows the hang-up.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.base.processes import spawn
from bench.harness.faults import Forwarder
from tests.support.chart import Release
from tests.support.helm_test_pod import passed, rendered, run_helm_test
from tests.truss.conftest import Pod

pytestmark = pytest.mark.slow

VALUES: dict[str, Any] = {
    "server": "truss",
    "modelServer": {"image": "registry.example.com/my-truss:0.1.0"},
    # 2,000 steps of 20 ms: 40 s, far past the 5 s the gauge has to fall.
    "test": {"body": '{"id": "helm-test", "steps": {maxTokens}}', "maxTokens": 2000,
             "timeoutSeconds": 15, "serverInflight": ["truss_model_calls_running"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def release() -> Release:
    return rendered(None, VALUES)


def test_passes_where_the_closed_connection_reaches_the_model(
    release: Release, truss_pods: dict[str, Pod]
) -> None:
    sidecar = truss_pods["polling"].sidecars["none"]
    done = run_helm_test(release, sidecar.url("http"), sidecar.url("admin"))
    assert passed(done), done.stdout + done.stderr
    assert "truss_model_calls_running" in done.stdout
    assert truss_pods["polling"].server.ended()["helm-test"]["how"] == "disconnected"


async def test_fails_behind_a_hop_that_swallows_the_hang_up(
    release: Release, truss_pods: dict[str, Pod], tmp_path: Any
) -> None:
    server = truss_pods["polling"].server
    hop = Forwarder(server.http, swallow_hang_ups=True)
    address = await hop.start()
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", f"http://{address}", "--cancel-adapter", "none"]  # fmt: skip
    try:
        with spawn("proxy", args, tmp_path) as sidecar:
            done = await asyncio.to_thread(
                run_helm_test, release, sidecar.url("http"), sidecar.url("admin"),
                server_metrics=f"{server.url()}/metrics/",
            )  # fmt: skip
    finally:
        await hop.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "did not reach the server" in done.stderr, done.stderr
