"""Every object every ci/ scenario renders, against the Kubernetes API's own schemas
(``kubernetes-validate``, offline, strict: a field the API does not know is an error), and the
InferencePool against the constraints of its CRD (``inference.networking.k8s.io/v1``, Gateway
API Inference Extension), which those schemas do not hold. The monitoring CRDs
(ServiceMonitor, PodMonitor, PrometheusRule) are not validated here; promtool checks the rules
(``test_observability.py``).
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from tests.support.chart import HelmEngine, Release, scenarios

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
        if obj["kind"] in NOT_VALIDATED:
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
