"""A pod of a server that is not hangup's: Truss's own model server (an image built here from
Truss's server and a model of the Truss tier's, tests/support/truss_image.py) beside the sidecar
built from the Dockerfile, as the chart's `server: truss` preset renders them, played by `podman
kube play` (tests/support/kube_pod.py says what podman needs changed, and why) and checked as the
kubelet would: both containers run as declared, every probe the chart declares answers, a hang-up
at the sidecar's port reaches the model (its ``is_disconnected()``), a cancel by id needs the
Secret's token and ends the call, the chart's `helm test` script passes inside the pod, and the
pod drains on shutdown (the last test: it ends the pod).

The model is ``polling_stream``: a generator that writes a line every 20 ms and asks
``is_disconnected()`` before each, recording how each call ended in /tmp/polling_stream.jsonl and
counting the calls it runs in ``truss_model_calls_running`` on Truss's /metrics/.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.base.scrape import metric_sum, parse, total
from bench.base.waiting import poll_until
from tests.deploy.test_chart_pod import wait_ready
from tests.support.chart import HelmEngine
from tests.support.containers import Engine
from tests.support.kube_pod import Pod, played_pod
from tests.support.truss_image import MODEL, TRUSS_IMAGE

pytestmark = pytest.mark.slow

STEP_S = 0.02  # the model's step
VALUES: dict[str, Any] = {
    "fullnameOverride": "hangup-truss",  # a pod name of its own beside the gateway's pod tests
    "server": "truss",
    "image": {"repository": "localhost/hangup", "tag": "test", "pullPolicy": "Never"},
    "modelServer": {"image": TRUSS_IMAGE, "drainTimeoutSeconds": 5,
                    "env": [{"name": "TRUSS_RECORD_DIR", "value": "/tmp"}]},
    "shutdown": {"preStopSeconds": 1, "marginSeconds": 2},
    "proxy": {"drainTimeoutSeconds": 3, "cancelDeadlineSeconds": 2},
    "test": {"body": '{"id": "helm-test", "steps": {maxTokens}}', "maxTokens": 2000,
             "timeoutSeconds": 20, "serverInflight": ["truss_model_calls_running"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def rendered(helm: HelmEngine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    release = helm.render(VALUES)
    assert release.ok, release.error
    return release.objects(), release.hook_objects()


@pytest.fixture(scope="module")
def pod(
    engine: Engine,
    cpu_image: Any,
    truss_image: Any,
    rendered: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> Iterator[Pod]:
    if engine.podman is None:
        pytest.skip(f"the chart's pod is played by podman's kube play; {engine.name} has none")
    with played_pod(engine.podman, rendered[0]) as played:
        wait_ready(played)
        yield played


def records(pod: Pod) -> dict[str, dict[str, Any]]:
    """How each call ended, as the model recorded it (the latest line per call id)."""
    done = pod.podman_run("exec", pod.container_id("truss"), "cat", f"/tmp/{MODEL}.jsonl")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.endswith("}")]
    return {line["id"]: line for line in lines}


def ended(pod: Pod, call: str) -> dict[str, Any] | None:
    line = records(pod).get(call)
    return line if line and line["how"] != "started" else None


def open_stream(pod: Pod, call: str, steps: int) -> tuple[socket.socket, bytes]:
    """A streamed predict through the sidecar's published HTTP port: the socket once the model's
    first line has come, and the response head."""
    sock = socket.create_connection(("127.0.0.1", pod.host_ports["http"]), timeout=10)
    body = json.dumps({"id": call, "steps": steps}).encode()
    sock.sendall(b"POST /v1/models/model:predict HTTP/1.1\r\nHost: truss\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))  # fmt: skip
    seen = b""
    while f"{call} 0".encode() not in seen:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the first line: {seen!r}"
        seen += chunk
    head, _, _ = seen.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), seen[:300]
    return sock, head


def header(head: bytes, name: str) -> str:
    (value,) = [line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                if line.lower().startswith(name.lower().encode() + b":")]  # fmt: skip
    return value


def read_to_end(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(65536)):
        out += chunk
    return out


def test_both_containers_run_as_the_chart_declares(pod: Pod) -> None:
    truss = pod.inspect("truss")
    assert truss["State"]["Running"], truss["State"]
    entry = truss["Config"]["Entrypoint"]  # podman 4.3 gives it as one string
    assert " ".join([entry] if isinstance(entry, str) else entry) == "python3 /app/main.py"
    assert "INFERENCE_SERVER_PORT=8000" in truss["Config"]["Env"]
    for name in ("truss", "proxy"):
        info = pod.inspect(name)
        assert info["Config"]["User"].split(":")[0] == "10001", info["Config"]["User"]
        assert info["HostConfig"]["ReadonlyRootfs"] is True
    args = pod.container("proxy")["args"]
    assert "--cancel-adapter=none" in args and "--upstream-http=http://127.0.0.1:8000" in args


@pytest.mark.parametrize("container", ["truss", "proxy"])
def test_every_probe_the_chart_declares_answers(pod: Pod, container: str) -> None:
    declared = [k for k in ("startupProbe", "livenessProbe", "readinessProbe")
                if k in pod.container(container)]  # fmt: skip
    assert "livenessProbe" in declared and "readinessProbe" in declared, declared
    for kind in declared:
        passed, saw = pod.probe(container, kind)
        assert passed, f"{container}'s {kind}: {saw}"


def test_a_hang_up_at_the_sidecar_reaches_the_model(pod: Pod) -> None:
    admin = pod.url("admin")
    before = metric_sum(admin, "hangup_proxy_client_disconnects_total")
    call = uuid.uuid4().hex
    sock, _ = open_stream(pod, call, steps=1000)  # 20 s of lines
    sock.close()  # hang up mid-stream
    line = poll_until(lambda: ended(pod, call), 5, "the model to see its client gone",
                      interval=0.1, explain=lambda: pod.logs("truss")[-2000:])  # fmt: skip
    assert line["how"] in ("disconnected", "closed") and line["step"] < 100, line
    assert metric_sum(admin, "hangup_proxy_client_disconnects_total") > before
    poll_until(lambda: model_running(pod) == 0, 5, "no call running in the model")


def model_running(pod: Pod) -> float:
    """The model's gauge, read through the sidecar's port as the chart's ServiceMonitor reads it
    (Truss serves its exporter at /metrics/)."""
    with urllib.request.urlopen(f"{pod.url('http')}/metrics/", timeout=10) as resp:
        return total(parse(resp.read().decode()), "truss_model_calls_running")


def test_a_cancel_by_id_needs_the_secret_token_and_ends_the_call(pod: Pod) -> None:
    token = next(iter(pod.secrets.values()))["token"]
    call = uuid.uuid4().hex
    sock, head = open_stream(pod, call, steps=1000)
    request_id = header(head, "X-Request-Id")
    try:
        for wrong in (None, token[::-1]):
            status, body = cancel_by_id(pod, request_id, wrong)
            assert status == 401, (status, body)
        assert ended(pod, call) is None, "a refused cancel ended the call"
        status, body = cancel_by_id(pod, request_id, token)
        assert status == 200 and json.loads(body)["state"] == "cancelled", (status, body)
        sock.settimeout(10)
        read_to_end(sock)  # the stream ends
    finally:
        sock.close()
    line = poll_until(lambda: ended(pod, call), 5, "the model to see the call gone", interval=0.1)
    assert line["how"] in ("disconnected", "closed") and line["step"] < 200, line


def cancel_by_id(pod: Pod, request_id: str, token: str | None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", pod.host_ports["http"], timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request("POST", f"/v2/requests/{request_id}/cancel", body=b"", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_the_helm_test_script_passes_inside_the_pod(
    pod: Pod, rendered: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    """The chart's test pod's command and environment, run in the sidecar's container (the
    test pod's image), its Service's name replaced by the pod's own 127.0.0.1."""
    (test_pod,) = [o for o in rendered[1] if o["kind"] == "Pod"]
    container = test_pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]} | {"HANGUP_TEST_HOST": "127.0.0.1"}
    assert env["HANGUP_TEST_KIND"] == "truss" and "HANGUP_TEST_PODS" not in env
    argv = ["exec", *(f"--env={k}={v}" for k, v in env.items()), pod.container_id("proxy"),
            *container["command"], *container["args"]]  # fmt: skip
    done = pod.podman_run(*argv, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS 127.0.0.1" in done.stdout and "truss_model_calls_running" in done.stdout
    assert ended(pod, "helm-test")["how"] in ("disconnected", "closed")  # type: ignore[index]


def test_the_pod_drains_on_shutdown(pod: Pod) -> None:
    """Last: it ends the pod. As the kubelet shuts it down (Pod.terminate): a call shorter than
    the proxy's drain finishes; one that outlives it is ended by the sidecar (Truss's preStop
    keeps it serving until then) and the model sees its client gone; both exit 0 in the grace
    period, Truss after the sidecar."""
    grace = pod.spec["terminationGracePeriodSeconds"]
    long_call, short_call = uuid.uuid4().hex, uuid.uuid4().hex
    long_stream, _ = open_stream(pod, long_call, steps=2000)  # 40 s
    short_stream, _ = open_stream(pod, short_call, steps=75)  # 1.5 s
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(pod.terminate)
        try:
            for sock in (long_stream, short_stream):
                sock.settimeout(grace + 5)
            short_rest = read_to_end(short_stream)
            long_rest = read_to_end(long_stream)
        finally:
            long_stream.close()
            short_stream.close()
        stopping.result(timeout=grace + 60)
    assert short_rest.endswith(b"\r\n0\r\n\r\n") and f"{short_call} 74".encode() in short_rest
    assert f"{long_call} 1999".encode() not in long_rest
    for container in ("truss", "proxy"):
        assert pod.exit_code(container) == 0, (container, pod.logs(container)[-2000:])
        assert pod.terminated[container] < grace, (container, pod.terminated, grace)
    assert pod.terminated["truss"] > pod.terminated["proxy"], pod.terminated
