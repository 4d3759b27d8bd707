"""The sidecar added to a Deployment of the user's, run: a Deployment written as a user writes one
(Truss's own server from the image tests/support/truss_image.py builds, on the pod's address,
no probe or preStop of ours), the chart's patch for it (``existingDeployment``, rendered as
`helm template` renders it) merged in as ``kubectl patch`` merges it (tests/support/kube_patch.py),
and the Secret beside it, played by `podman kube play`. Podman runs no native sidecar (an init
container with ``restartPolicy: Always`` would never end), so the patch's second-container form
is played; kubernetes-validate checks the native form (test_chart_kubernetes.py).

Checked: the user's container is as they wrote it but for its preStop; the proxy reads the token
from the Secret without the chart's fsGroup; a hang-up at the sidecar's port reaches the model;
the pod drains on shutdown, the user's server after the sidecar.
"""

from __future__ import annotations

import concurrent.futures
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bench.base.waiting import poll_until
from tests.deploy.test_chart_pod import wait_ready
from tests.deploy.test_chart_pod_truss import ended, open_stream, read_to_end
from tests.support.chart import HelmEngine
from tests.support.containers import Engine
from tests.support.kube_patch import strategic_merge
from tests.support.kube_pod import Pod, played_pod
from tests.support.truss_image import TRUSS_IMAGE

pytestmark = pytest.mark.slow

USERS: dict[str, Any] = yaml.safe_load(f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: my-truss, labels: {{app: my-truss}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: my-truss}}}}
  template:
    metadata: {{labels: {{app: my-truss}}}}
    spec:
      containers:
        - name: truss
          image: {TRUSS_IMAGE}
          imagePullPolicy: Never
          env:
            - {{name: INFERENCE_SERVER_PORT, value: "8000"}}
            - {{name: TRUSS_RECORD_DIR, value: /tmp}}
""")
VALUES: dict[str, Any] = {
    "fullnameOverride": "hangup-patch",
    "server": "truss",
    "existingDeployment": {"name": "my-truss", "container": "truss",
                           "selector": {"app": "my-truss"}},
    "image": {"repository": "localhost/hangup", "tag": "test", "pullPolicy": "Never"},
    "modelServer": {"drainTimeoutSeconds": 5},  # Truss took 2 s to stop after its SIGTERM
    "shutdown": {"preStopSeconds": 1, "marginSeconds": 2},
    "proxy": {"drainTimeoutSeconds": 3, "cancelDeadlineSeconds": 2},
}  # fmt: skip


@pytest.fixture(scope="module")
def merged(helm: HelmEngine) -> list[dict[str, Any]]:
    """The Secret, and the user's Deployment with the chart's patch merged in."""
    release = helm.render(VALUES)
    assert release.ok, release.error
    (patch,) = release.find("Deployment")
    assert patch["metadata"]["annotations"]["hangup/patch"] == "strategic-merge"
    return [*release.find("Secret"), strategic_merge(USERS, patch)]


@pytest.fixture(scope="module")
def pod(
    engine: Engine, cpu_image: Any, truss_image: Any, merged: list[dict[str, Any]]
) -> Iterator[Pod]:
    if engine.podman is None:
        pytest.skip(f"the pod is played by podman's kube play; {engine.name} has none")
    with played_pod(engine.podman, merged) as played:
        wait_ready(played)
        poll_until(lambda: truss_ready(played), 60, "Truss's model loaded", interval=0.2,
                   explain=lambda: played.logs("truss")[-2000:])  # fmt: skip
        yield played


def truss_ready(pod: Pod) -> bool:
    check = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v1/models/model')"
    return pod.podman_run("exec", pod.container_id("truss"), "python3", "-c", check).returncode == 0


def test_the_users_container_is_theirs_but_for_its_pre_stop(pod: Pod) -> None:
    server = pod.container("truss")
    written = USERS["spec"]["template"]["spec"]["containers"][0]
    assert {k: v for k, v in server.items() if k != "lifecycle"} == written
    assert server["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "6"]  # 1 + 3 + 2
    assert [c["name"] for c in pod.spec["containers"]] == ["truss", "proxy"]


def test_the_proxy_reads_the_token_without_the_charts_fs_group(pod: Pod) -> None:
    assert "securityContext" not in pod.spec  # the user's pod: no fsGroup
    token = pod.podman_run(
        "exec", pod.container_id("proxy"), "cat", "/var/run/hangup/cancel-token/token"
    )
    assert token.returncode == 0, token.stderr
    assert token.stdout == next(iter(pod.secrets.values()))["token"]


def test_a_hang_up_at_the_sidecar_reaches_the_users_model(pod: Pod) -> None:
    call = uuid.uuid4().hex
    sock, _ = open_stream(pod, call, steps=1000)
    sock.close()
    line = poll_until(lambda: ended(pod, call), 5, "the model to see its client gone", interval=0.1)
    assert line["how"] in ("disconnected", "closed") and line["step"] < 100, line
    with urllib.request.urlopen(f"{pod.url('admin')}/metrics", timeout=10) as resp:
        assert b'hangup_proxy_client_disconnects_total{protocol="http"' in resp.read()


def test_only_the_sidecar_has_ports(merged: list[dict[str, Any]]) -> None:
    """The proxy's ports are the pod's only declared ones (the user's container has none here;
    in a cluster the chart's NetworkPolicy admits only the sidecar's, test_chart_kubernetes.py)."""
    deployment = merged[-1]
    ports = [p for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])]  # fmt: skip
    assert {p["name"] for p in ports} == {"http", "admin"}


def test_the_pod_drains_on_shutdown_the_users_server_last(pod: Pod) -> None:
    """Last: it ends the pod. A call shorter than the proxy's drain finishes; both containers
    exit 0 in the grace period, the user's server after the sidecar (the patch's preStop)."""
    grace = pod.spec["terminationGracePeriodSeconds"]
    call = uuid.uuid4().hex
    stream, _ = open_stream(pod, call, steps=75)  # 1.5 s
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(pod.terminate)
        try:
            stream.settimeout(grace + 5)
            rest = read_to_end(stream)
        finally:
            stream.close()
        stopping.result(timeout=grace + 60)
    assert rest.endswith(b"\r\n0\r\n\r\n") and f"{call} 74".encode() in rest, rest[-200:]
    for container in ("truss", "proxy"):
        assert pod.exit_code(container) == 0, (container, pod.logs(container)[-2000:])
        assert pod.terminated[container] < grace, (container, pod.terminated, grace)
    assert pod.terminated["truss"] > pod.terminated["proxy"], pod.terminated
