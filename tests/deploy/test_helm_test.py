"""`helm test` for the gateway preset, run against the real gateway and proxy: the rendered test
pod's script and environment (tests/support/helm_test_pod.py) pass where the sidecar's cancel
reaches the gateway, and fail where a hang-up does not get through: the proxy with its cancel
off (``--cancel-adapter none``) behind a hop that swallows the closed connection, as a router or
a middleware does. The other presets' `helm test` runs against their real servers in their
tiers (tests/vllm, tests/triton, tests/truss).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.base.processes import Process, spawn
from bench.harness.faults import Forwarder
from tests.support.chart import HelmEngine, Release
from tests.support.helm_test_pod import passed, rendered, run_helm_test

pytestmark = pytest.mark.slow

TOKEN = "helm-test-token"
VALUES: dict[str, Any] = {"test": {"timeoutSeconds": 10, "maxTokens": 4000}}


@pytest.fixture(scope="module")
def release(helm: HelmEngine) -> Release:
    return rendered(helm, VALUES)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Path]]:
    tmp = tmp_path_factory.mktemp("helm-test")
    token = tmp / "token"
    token.write_text(TOKEN)
    args = ["--http-port", "0", "--grpc-port", "0", "--cancel-token-file", str(token)]
    with spawn("gateway_server", args, tmp / "gateway") as process:
        yield process, token


@contextlib.contextmanager
def sidecar(upstream: str, adapter: str, token: Path, tmp: Path) -> Iterator[Process]:
    args = ["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", upstream, "--cancel-adapter", adapter,
            "--cancel-token-file", str(token)]  # fmt: skip
    with spawn("proxy", args, tmp) as process:
        yield process


def test_the_rendered_test_checks_the_cancel_call_and_the_gateway(release: Release) -> None:
    from tests.support.helm_test_pod import helm_test_env

    env = helm_test_env(release, "http://front", "http://admin")
    assert env["HANGUP_TEST_KIND"] == "openai" and env["HANGUP_TEST_MODEL"] == "hangup-sim"
    assert env["HANGUP_TEST_CANCEL_CALLS"] == "1"
    assert env["HANGUP_TEST_SERVER_INFLIGHT"] == '["hangup_gateway_inflight_requests"]'
    assert "hangup_gateway_cancellations_total" in env["HANGUP_TEST_SERVER_COUNTER"]
    assert env["HANGUP_TEST_SERVER_METRICS_URL"] == "http://front/metrics"


def test_passes_where_the_sidecar_cancels_at_the_gateway(
    release: Release, gateway: tuple[Process, Path], tmp_path: Path
) -> None:
    server, token = gateway
    with sidecar(server.url("http"), "hangup", token, tmp_path) as proxy:
        done = run_helm_test(release, proxy.url("http"), proxy.url("admin"))
    assert passed(done), done.stdout + done.stderr
    assert "acknowledged" in done.stdout and "hangup_gateway_cancellations_total" in done.stdout


async def test_fails_where_the_hang_up_does_not_get_through(
    release: Release, gateway: tuple[Process, Path], tmp_path: Path
) -> None:
    """The proxy counts the hang-up and closes its upstream connection, but makes no cancel
    call, and the hop in between keeps the gateway's connection open: the gateway streams on."""
    server, token = gateway
    hop = Forwarder(server.listeners["http"], swallow_hang_ups=True)
    address = await hop.start()
    try:
        with sidecar(f"http://{address}", "none", token, tmp_path) as proxy:
            done = await asyncio.to_thread(
                run_helm_test, release, proxy.url("http"), proxy.url("admin"),
                server_metrics=f"{server.url('http')}/metrics",
            )  # fmt: skip
    finally:
        await hop.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stderr and "did not reach the server" in done.stderr, done.stderr
