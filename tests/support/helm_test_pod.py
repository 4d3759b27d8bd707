"""The chart's `helm test` pod, run here: its script and environment as Helm rendered them for a
``server`` preset, pointed at a sidecar (and a server's metrics) on this machine's loopback.

The pod's variables name the Service (or the headless one) with ``{host}``; here each address is
given whole: the sidecar's HTTP and admin addresses, and where the server's own /metrics is read
(through the sidecar's HTTP port as the pod reads it, or Triton's metrics port). Everything else
(the call, the model, what the server must show) is as rendered.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from typing import Any

from bench.base.processes import child_env
from tests.support.chart import HelmEngine, Release


def test_pod(release: Release) -> dict[str, Any]:
    (pod,) = [o for o in release.hook_objects() if o["kind"] == "Pod"]
    return dict(pod)


def rendered(helm: HelmEngine | None, values: dict[str, Any]) -> Release:
    """The release ``values`` render (with Helm's engine here; Unavailable without one)."""
    if helm is None:
        helm = HelmEngine()
    release = helm.render(values)
    assert release.ok, release.error
    return release


def helm_test_env(
    release: Release, url: str, admin: str, server_metrics: str | None = None
) -> dict[str, str]:
    """The test pod's environment for a sidecar at ``url`` (admin ``admin``): the server's
    metrics at ``server_metrics``, or through ``url`` at the path the pod reads them on."""
    container = test_pod(release)["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container["env"]}
    rendered_metrics = env["HANGUP_TEST_SERVER_METRICS_URL"]
    path = urllib.parse.urlsplit(rendered_metrics.replace("{host}", "host")).path
    env.pop("HANGUP_TEST_PODS", None)
    env.update({
        "HANGUP_TEST_HOST": "127.0.0.1", "HANGUP_TEST_URL": url, "HANGUP_TEST_ADMIN_URL": admin,
        "HANGUP_TEST_SERVER_METRICS_URL": server_metrics or f"{url}{path}",
    })  # fmt: skip
    return env


def run_helm_test(
    release: Release,
    url: str,
    admin: str,
    server_metrics: str | None = None,
    **overrides: str,
) -> subprocess.CompletedProcess[str]:
    """The pod's command (``python3 -c <the rendered script>``) with its environment
    (``overrides`` replace variables), on this interpreter; it exits 0 on PASS."""
    container = test_pod(release)["spec"]["containers"][0]
    assert container["command"] == ["python3", "-c"], container["command"]
    env = helm_test_env(release, url, admin, server_metrics) | overrides
    timeout = float(env["HANGUP_TEST_TIMEOUT"]) + 60
    return subprocess.run(
        [sys.executable, "-c", container["args"][0]],
        capture_output=True, text=True, env=child_env(env), timeout=timeout, check=False,
    )  # fmt: skip


def passed(done: subprocess.CompletedProcess[str]) -> bool:
    """Whether the run passed, as `helm test` judges it (exit 0), and said so."""
    return done.returncode == 0 and "PASS" in done.stdout and "FAIL" not in done.stderr
