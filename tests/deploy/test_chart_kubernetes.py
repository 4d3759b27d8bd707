"""Every object every ci/ scenario renders, against the Kubernetes API's own schemas
(``kubernetes-validate``, offline, strict: a field the API does not know is an error), and the
InferencePool against the constraints of its CRD (``inference.networking.k8s.io/v1``, Gateway
API Inference Extension), which those schemas do not hold. The monitoring CRDs
(ServiceMonitor, PodMonitor, PrometheusRule) are not validated here; promtool checks the rules
(``test_observability.py``).

The patch for a Deployment of the user's (``existingDeployment``) is no object of its own: it is
merged, as the API server merges a strategic-merge patch (``kubectl patch``), into a Deployment
such as a user has (vLLM's production stack writes one much like it), and the result validated:
the proxy a native sidecar (an init container with ``restartPolicy: Always``) or a second
container. ``kubectl kustomize`` (the project's own kubectl: ``make k8s-tools``) must merge it
the same way.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.chart import HelmEngine, Release, scenario, scenarios
from tests.support.kube_patch import kubectl, strategic_merge, unordered

KUBERNETES = "1.33"
NOT_VALIDATED = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")  # fmt: skip
LABEL_VALUE = re.compile(r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize("name", scenarios())
def test_every_object_is_valid_for_the_kubernetes_api(
    renders: dict[str, Release], name: str
) -> None:
    release = renders[name]
    assert release.ok, release.error
    for obj in [*release.objects(), *release.hook_objects()]:
        if obj["kind"] in NOT_VALIDATED or is_patch(obj):
            continue
        if obj["kind"] == "InferencePool":
            assert inference_pool_problems(obj) == [], obj
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {obj['kind']} {obj['metadata']['name']}: {where}: {exc.message}")


def inference_pool_problems(pool: dict[str, Any]) -> list[str]:
    """What the InferencePool v1 CRD would refuse (its OpenAPI and CEL rules)."""
    problems = []
    if pool.get("apiVersion") != "inference.networking.k8s.io/v1":
        problems.append(f"apiVersion {pool.get('apiVersion')}")
    unknown = set(pool) - {"apiVersion", "kind", "metadata", "spec"}
    spec = pool.get("spec", {})
    unknown |= set(spec) - {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    labels = spec.get("selector", {}).get("matchLabels", {})
    unknown |= set(spec.get("selector", {})) - {"matchLabels"}
    if not 1 <= len(labels) <= 64:
        problems.append(f"{len(labels)} selector labels (1-64)")
    for key, value in labels.items():
        if not LABEL_NAME.match(key) or not LABEL_VALUE.match(str(value)):
            problems.append(f"selector label {key}={value}")
    ports = spec.get("targetPorts", [])
    numbers = [p.get("number") for p in ports]
    if not 1 <= len(ports) <= 8:
        problems.append(f"{len(ports)} target ports (1-8)")
    if len(set(numbers)) != len(numbers):
        problems.append("target port numbers must be unique")
    for port in ports:
        unknown |= set(port) - {"number"}
        if not (isinstance(port.get("number"), int) and 1 <= port["number"] <= 65535):
            problems.append(f"target port {port}")
    if spec.get("appProtocol", "http") not in ("http", "kubernetes.io/h2c"):
        problems.append(f"appProtocol {spec['appProtocol']}")
    ref = spec.get("endpointPickerRef")
    if ref is not None:
        unknown |= set(ref) - {"group", "kind", "name", "port", "failureMode"}
        if not ref.get("name") or len(ref["name"]) > 253:
            problems.append("endpointPickerRef.name is required")
        if ref.get("kind", "Service") == "Service" and "port" not in ref:
            problems.append("endpointPickerRef.port is required when kind is Service")
        port = ref.get("port", {"number": 1})
        unknown |= set(port) - {"number"}
        if not (isinstance(port.get("number"), int) and 1 <= port["number"] <= 65535):
            problems.append(f"endpointPickerRef.port {port}")
        if ref.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
            problems.append(f"failureMode {ref['failureMode']}")
    if not DNS_LABEL.match(pool.get("metadata", {}).get("name", "")):
        problems.append("metadata.name")
    return problems + [f"unknown field {field}" for field in sorted(unknown)]


def test_the_checker_refuses_what_the_crd_refuses() -> None:
    good = {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 8080}],
                 "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}},
    }  # fmt: skip
    assert inference_pool_problems(good) == []
    bad_specs = [
        {"selector": {"matchLabels": {}}},
        {"targetPorts": [{"number": 8080}, {"number": 8080}]},
        {"targetPorts": [{"number": 70000}]},
        {"targetPorts": [{"number": p} for p in range(1, 10)]},
        {"endpointPickerRef": {"name": "epp"}},  # a Service needs its port
        {"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Open"}},
        {"appProtocol": "grpc"},
        {"replicas": 3},
    ]
    for change in bad_specs:
        assert inference_pool_problems({**good, "spec": {**good["spec"], **change}}), change


def test_the_pool_selects_exactly_this_releases_pods_on_the_proxys_port(
    renders: dict[str, Release],
) -> None:
    release = renders["inference-pool-values.yaml"]
    pool = release.one("InferencePool")
    deployment = release.one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]  # this release's pods only
    assert "app.kubernetes.io/instance" in selector and selector.items() <= pod_labels.items()
    proxy = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "proxy")  # fmt: skip
    http = next(p["containerPort"] for p in proxy["ports"] if p["name"] == "http")
    assert pool["spec"]["targetPorts"] == [{"number": http}]
    assert pool["spec"]["appProtocol"] == "http"
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service", "name": "hangup-epp", "port": {"number": 9002},
        "failureMode": "FailOpen",
    }  # fmt: skip
    assert pod_labels["llm-d.ai/inference-serving"] == "true"
    assert pod_labels["llm-d.ai/engine-type"] == "vllm"
    assert "InferencePool" in release.notes and "/metrics" in release.notes


def test_no_pool_and_no_llmd_labels_unless_asked(renders: dict[str, Release]) -> None:
    release = renders["default-values.yaml"]
    assert release.find("InferencePool") == []
    labels = release.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not any(key.startswith("llm-d.ai/") for key in labels)


def test_a_pool_without_its_picker_is_refused(helm: HelmEngine) -> None:
    release = helm.render({"inferencePool": {"enabled": True}})
    assert not release.ok
    assert "inferencePool.enabled needs inferencePool.endpointPickerRef.name" in release.error


@pytest.mark.parametrize(
    "ref",
    [{"name": "epp", "failureMode": "Open"}, {"name": "epp", "port": 0},
     {"name": "epp", "port": 70000}, {"name": "epp", "kind": "not a kind"}],
    ids=["failure-mode", "port-zero", "port-too-big", "bad-kind"],
)  # fmt: skip
def test_the_schema_refuses_a_bad_picker_ref(helm: HelmEngine, ref: dict[str, Any]) -> None:
    assert not helm.lint({"inferencePool": {"enabled": True, "endpointPickerRef": ref}}).ok


def is_patch(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("annotations", {}).get("hangup/patch"))


# A Deployment of the user's: `vllm serve` on the pod's address, as vLLM's production stack and
# most hand-written manifests run it.
USER_DEPLOYMENT: dict[str, Any] = yaml.safe_load("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm-llama, labels: {app: vllm-llama}}
spec:
  replicas: 2
  selector: {matchLabels: {app: vllm-llama}}
  template:
    metadata: {labels: {app: vllm-llama}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          args: [meta-llama/Llama-3.1-8B-Instruct, --host, 0.0.0.0, --port, "8000"]
          ports: [{name: http, containerPort: 8000}]
          readinessProbe: {httpGet: {path: /health, port: 8000}}
          resources: {limits: {nvidia.com/gpu: 1}}
          volumeMounts: [{name: shm, mountPath: /dev/shm}]
      volumes: [{name: shm, emptyDir: {medium: Memory}}]
""")


def patched(helm: HelmEngine, native: bool) -> tuple[dict[str, Any], dict[str, Any], Release]:
    values = scenario("existing-deployment-values.yaml")
    values["proxy"] = {**values.get("proxy", {}), "nativeSidecar": native}
    release = helm.render(values)
    assert release.ok, release.error
    (patch,) = [o for o in release.objects() if o["kind"] == "Deployment"]
    assert is_patch(patch)
    return patch, strategic_merge(USER_DEPLOYMENT, patch), release


@pytest.mark.parametrize("native", [True, False], ids=["native-sidecar", "second-container"])
def test_the_patch_adds_the_sidecar_to_a_deployment_of_yours(
    helm: HelmEngine, native: bool
) -> None:
    _, merged, release = patched(helm, native)
    kubernetes_validate.validate(merged, KUBERNETES, strict=True)
    spec = merged["spec"]["template"]["spec"]
    assert merged["spec"]["selector"] == USER_DEPLOYMENT["spec"]["selector"]  # unchanged
    server = next(c for c in spec["containers"] if c["name"] == "vllm")
    original = USER_DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]
    assert {k: v for k, v in server.items() if k != "lifecycle"} == original  # only its preStop
    pre_stop = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    if native:
        (proxy,) = spec["initContainers"]
        assert proxy["name"] == "proxy" and proxy["restartPolicy"] == "Always"
        assert proxy["startupProbe"]["httpGet"]["path"] == "/readyz"  # vLLM starts after it
        assert [c["name"] for c in spec["containers"]] == ["vllm"]
    else:
        assert "initContainers" not in spec
        assert [c["name"] for c in spec["containers"]] == ["vllm", "proxy"]
        proxy = spec["containers"][1]
    assert "--upstream-http=http://127.0.0.1:8000" in proxy["args"]
    assert "--cancel-adapter=vllm" in proxy["args"]
    drain = [int(a.split("=")[1]) for a in proxy["args"] if a.startswith(("--drain-timeout=",
             "--cancel-deadline="))]  # fmt: skip
    assert pre_stop >= sum(drain)  # vLLM serves on while the proxy drains and cancels
    assert spec["terminationGracePeriodSeconds"] >= pre_stop
    volumes = {v["name"] for v in spec["volumes"]}
    assert volumes == {"shm", "cancel-token", "proxy-tmp"}
    secret = next(v for v in spec["volumes"] if v["name"] == "cancel-token")["secret"]
    assert secret["secretName"] == release.one("Secret")["metadata"]["name"]
    # Clients reach the sidecar's port; vLLM's own port stays inside the pod.
    ports = {p["containerPort"] for p in proxy["ports"]}
    service = release.one("Service")
    assert service["spec"]["selector"] == {"app": "vllm-llama"}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports | {"http", "admin"}
    policy = release.one("NetworkPolicy")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app": "vllm-llama"}}
    allowed = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert allowed == {8080, 9090} if native else {"http", "admin"}
    assert 8000 not in allowed


def test_kustomize_merges_the_patch_as_the_api_server_does(
    helm: HelmEngine, tmp_path: Path
) -> None:
    """What docs/kubernetes.md shows a kustomize user: the Deployment, the patch under
    `patches`; `kubectl kustomize` gives the Deployment merged here."""
    patch, merged, _ = patched(helm, native=True)
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(USER_DEPLOYMENT))
    (tmp_path / "hangup-patch.yaml").write_text(yaml.safe_dump(patch))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": ["deployment.yaml"], "patches": [{"path": "hangup-patch.yaml"}]}
    ))  # fmt: skip
    done = subprocess.run([str(kubectl()), "kustomize", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert unordered(yaml.safe_load(done.stdout)) == unordered(merged)
