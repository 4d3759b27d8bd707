"""The chart's pod, run: `helm template` of the chart (Helm's engine) with values for a local run,
played by `podman kube play` from the CPU image the image tests build (tests/support/kube_pod.py
says what podman needs changed in the rendered objects, and why). Both containers start as the
chart declares them, every probe it declares answers, a hang-up through the sidecar's port is
cancelled at the gateway, a cancel by id needs the token from the chart's Secret, and the shutdown
the chart sets (preStop hooks, drains, grace period) ends a stream that outlives the drain with a
cancel and lets a shorter one finish.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from bench.base.scrape import metric_sum
from bench.base.waiting import poll_until
from bench.harness.stack import completion_request
from tests.support.chart import HelmEngine
from tests.support.containers import Engine
from tests.support.kube_pod import Pod, played_pod

pytestmark = pytest.mark.slow

MODEL = "hangup-sim"
# A local run's values: the image the tests built, and a shutdown short enough for a test (the
# chart derives the gateway's preStop and the grace period from these).
LOCAL_VALUES: dict[str, Any] = {
    "image": {"repository": "localhost/hangup", "tag": "test", "pullPolicy": "Never"},
    "shutdown": {"preStopSeconds": 1, "marginSeconds": 2},
    "proxy": {"drainTimeoutSeconds": 3, "cancelDeadlineSeconds": 2},
    "gateway": {"drainTimeoutSeconds": 2},
}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def wait_ready(pod: Pod) -> None:
    """Every container's startup probe, then its readiness probe, passes (as the kubelet waits
    before the pod joins a Service)."""
    for container in pod.spec["containers"]:
        for kind in ("startupProbe", "readinessProbe"):
            if kind in container:
                poll_until(
                    lambda c=container["name"], k=kind: pod.probe(c, k)[0],  # type: ignore[misc]
                    within=60,
                    what=f"{container['name']}'s {kind}",
                    interval=0.2,
                    explain=lambda c=container["name"]: pod.logs(c)[-2000:],  # type: ignore[misc]
                )


@pytest.fixture(scope="module")
def rendered(helm: HelmEngine) -> list[dict[str, Any]]:
    release = helm.render(LOCAL_VALUES)
    assert release.ok, release.error
    return release.objects()


@pytest.fixture(scope="module")
def pod(engine: Engine, cpu_image: Any, rendered: list[dict[str, Any]]) -> Iterator[Pod]:
    if engine.podman is None:
        pytest.skip(f"the chart's pod is played by podman's kube play; {engine.name} has none")
    with played_pod(engine.podman, rendered) as played:
        wait_ready(played)
        yield played


def open_stream(pod: Pod, max_tokens: int) -> tuple[socket.socket, str]:
    """A streamed completion through the sidecar's published HTTP port: the socket once the
    first event has come, and the call's id as the sidecar's response head names it."""
    sock = socket.create_connection(("127.0.0.1", pod.host_ports["http"]), timeout=10)
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": max_tokens, "stream": True}
    sock.sendall(completion_request("/v1/completions", body))
    seen = b""
    while b"data:" not in seen:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the first event: {seen!r}"
        seen += chunk
    head, _, _ = seen.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), seen[:300]
    ids = [
        line.split(b":", 1)[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    ]
    assert len(ids) == 1, head
    return sock, ids[0]


def read_to_end(sock: socket.socket) -> bytes:
    """The rest of a chunked response: to its last chunk, or to the connection's close."""
    out = b""
    while not out.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(65536)):
        out += chunk
    return out


def cancel_by_id(pod: Pod, request_id: str, token: str | None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", pod.host_ports["http"], timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request("POST", f"/v2/requests/{request_id}/cancel", body=b"", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def gateway_sum(pod: Pod, name: str, **labels: str) -> float:
    """A gateway metric, scraped through the sidecar's HTTP port as the chart's ServiceMonitor
    scrapes it (the gateway listens only on the pod's loopback)."""
    return metric_sum(pod.url("http"), name, **labels)


def test_both_containers_run_as_the_chart_declares(pod: Pod) -> None:
    for name, command in (("gateway", "hangup-gateway"), ("proxy", "hangup-proxy")):
        info = pod.inspect(name)
        assert info["State"]["Running"], info["State"]
        assert info["Config"]["User"].split(":")[0] == "10001", info["Config"]["User"]
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert not info.get("EffectiveCaps"), info.get("EffectiveCaps")
        assert info["Config"]["Entrypoint"][0] == command or info["Path"] == command, info["Path"]
    token = pod.podman_run(
        "exec", pod.container_id("proxy"), "cat", "/var/run/hangup/cancel-token/token"
    )
    assert token.returncode == 0, token.stderr
    assert token.stdout == next(iter(pod.secrets.values()))["token"]


@pytest.mark.parametrize("container", ["gateway", "proxy"])
def test_every_probe_the_chart_declares_answers(pod: Pod, container: str) -> None:
    declared = [kind for kind in PROBES if kind in pod.container(container)]
    assert "livenessProbe" in declared and "readinessProbe" in declared, declared
    for kind in declared:
        passed, saw = pod.probe(container, kind)
        assert passed, f"{container}'s {kind}: {saw}"


def test_a_hang_up_through_the_sidecar_is_cancelled_at_the_gateway(pod: Pod) -> None:
    admin = pod.url("admin")
    ok_before = metric_sum(admin, "hangup_proxy_cancel_calls_total", result="ok")
    cancelled_before = gateway_sum(
        pod, "hangup_gateway_cancellations_total", reason="client_disconnect"
    )
    sock, _ = open_stream(pod, max_tokens=4000)  # 40 s of tokens
    sock.close()  # hang up mid-stream
    poll_until(
        lambda: metric_sum(admin, "hangup_proxy_cancel_calls_total", result="ok") > ok_before,
        within=10,
        what="the sidecar's cancel call, answered ok",
    )
    poll_until(
        lambda: (
            gateway_sum(pod, "hangup_gateway_cancellations_total", reason="client_disconnect")
            > cancelled_before
        ),
        within=10,
        what="the gateway's cancellation for the hang-up",
    )
    poll_until(
        lambda: gateway_sum(pod, "hangup_gateway_inflight_requests") == 0,
        within=10,
        what="nothing in flight on the gateway",
    )


def test_a_cancel_by_id_needs_the_token_from_the_chart_secret(pod: Pod) -> None:
    token = next(iter(pod.secrets.values()))["token"]
    explicit_before = gateway_sum(pod, "hangup_gateway_cancellations_total", reason="explicit")
    sock, request_id = open_stream(pod, max_tokens=4000)
    try:
        for wrong in (None, token[::-1]):
            status, body = cancel_by_id(pod, request_id, wrong)
            assert status == 401, (status, body)
        assert sock.recv(65536), "the stream ended on a refused cancel"
        status, body = cancel_by_id(pod, request_id, token)
        assert status == 200 and json.loads(body)["state"] == "cancelled", (status, body)
        sock.settimeout(10)
        rest = read_to_end(sock)  # the stream ends
        assert b'"code": 499' in rest and b"[DONE]" not in rest, rest[-500:]
    finally:
        sock.close()
    poll_until(
        lambda: (
            gateway_sum(pod, "hangup_gateway_cancellations_total", reason="explicit")
            > explicit_before
        ),
        within=10,
        what="the gateway's cancellation for the cancel by id",
    )
