"""The chart's presets (`server: vllm-serve | triton | truss | sglang | custom`) as Helm renders
them: the dashboard's rows for each server, the alerts' runbook_url and the monitoring labels
kube-prometheus-stack selects on, what `helm test` calls and reads per preset, the notes a user
of each server reads, and the grace period a server of the user's needs. The containers, ports,
token and shutdown of every scenario are checked in test_chart.py; the patch for a Deployment of
the user's in test_chart_kubernetes.py.
"""

from __future__ import annotations

import json

import pytest
import yaml

from proxy.config import AdapterName
from tests.deploy.test_chart import containers, pod_spec, prestop_seconds
from tests.support.chart import CHART, HelmEngine, Release, scenario
from tests.support.observability_files import DASHBOARD, RULES


@pytest.mark.parametrize(
    ("name", "rows"),
    [("full-values.yaml", {1, 2}), ("vllm-serve-values.yaml", {1, 3}),
     ("triton-values.yaml", {1, 4})],
)  # fmt: skip
def test_the_dashboard_shows_the_rows_of_its_server(
    renders: dict[str, Release], name: str, rows: set[int]
) -> None:
    """The dashboard as observability/ has it, less the rows of servers this release does not
    run (a panel's id says its row): in front of `vllm serve`, no empty gateway panels."""
    shipped = json.loads(renders[name].one("ConfigMap")["data"]["hangup-dashboard.json"])
    source = json.loads(DASHBOARD.read_text())
    assert {p["id"] // 100 for p in shipped["panels"]} == rows
    kept = [p for p in source["panels"] if p["id"] // 100 in rows]
    assert shipped == {**source, "panels": kept}


def test_custom_servers_get_every_row(helm: HelmEngine) -> None:
    values = {**scenario("bring-your-own-server-values.yaml"), "dashboard": {"enabled": True}}
    shipped = json.loads(helm.render(values).one("ConfigMap")["data"]["hangup-dashboard.json"])
    assert shipped == json.loads(DASHBOARD.read_text())


def test_alerts_link_the_runbooks_where_the_values_say(renders: dict[str, Release]) -> None:
    """runbook_url, which Alertmanager and Grafana link, under metrics.prometheusRule.runbookUrl."""
    base = "https://github.com/example/hangup/blob/main/docs/runbooks.md"
    spec = renders["vllm-serve-values.yaml"].one("PrometheusRule")["spec"]
    alerts = [r for g in spec["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{base}#{alert['alert'].lower()}"
    source = yaml.safe_load(RULES.read_text())
    for ours, theirs in zip(spec["groups"], source["groups"], strict=True):
        for a, b in zip(ours["rules"], theirs["rules"], strict=True):  # only the URL differs
            a, b = dict(a, annotations={}), dict(b, annotations={})
            assert a == b


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor", "PrometheusRule"])
def test_kube_prometheus_stack_finds_the_monitoring_objects(helm: HelmEngine, kind: str) -> None:
    """kube-prometheus-stack's Prometheus selects monitors and rules labelled `release: <its
    release>`: metrics.labels puts one label on all three, beside each one's own labels."""
    values = {"metrics": {"labels": {"release": "kps"}, "serviceMonitor": {"enabled": True},
              "podMonitor": {"enabled": True, "labels": {"team": "ml"}},
              "prometheusRule": {"enabled": True}}}  # fmt: skip
    labels = helm.render(values).one(kind)["metadata"]["labels"]
    assert labels["release"] == "kps" and labels["app.kubernetes.io/instance"] == "rel"
    assert (labels.get("team") == "ml") == (kind == "PodMonitor")


def helm_test_env(release: Release) -> dict[str, str]:
    (pod,) = [o for o in release.hook_objects() if o["kind"] == "Pod"]
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


# What `helm test` calls and reads per preset (docs/kubernetes.md, "What helm test proves").
HELM_TEST = {
    "default-values.yaml": ("openai", "hangup-sim", "1", ["hangup_gateway_inflight_requests"],
                            ['hangup_gateway_cancellations_total{reason="client_disconnect"}'],
                            "http://{host}:8080/metrics"),
    "vllm-serve-values.yaml": ("openai", "tiny", "0",
                               ["vllm:num_requests_running", "vllm:num_requests_waiting"], [],
                               "http://{host}:8080/metrics"),
    "triton-values.yaml": ("triton", "vllm_model", "0",
                           ["vllm:num_requests_running", "vllm:num_requests_waiting"], [],
                           "http://{host}:8002/metrics"),
    "truss-values.yaml": ("truss", "model", "0", [], [], "http://{host}:8080/metrics/"),
    "sglang-values.yaml": ("openai", "", "1", [], [], "http://{host}:8080/metrics"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HELM_TEST))
def test_helm_test_calls_and_checks_what_the_preset_says(
    renders: dict[str, Release], name: str
) -> None:
    kind, model, cancel_calls, inflight, counter, metrics = HELM_TEST[name]
    env = helm_test_env(renders[name])
    assert (env["HANGUP_TEST_KIND"], env["HANGUP_TEST_MODEL"]) == (kind, model)
    assert env["HANGUP_TEST_CANCEL_CALLS"] == cancel_calls
    assert json.loads(env["HANGUP_TEST_SERVER_INFLIGHT"]) == inflight
    assert json.loads(env["HANGUP_TEST_SERVER_COUNTER"]) == counter
    assert env["HANGUP_TEST_SERVER_METRICS_URL"] == metrics


def test_helm_test_checks_every_pod_through_the_headless_service(
    renders: dict[str, Release],
) -> None:
    env = helm_test_env(renders["full-values.yaml"])
    assert env["HANGUP_TEST_PODS"] == "rel-hangup-pods" and "HANGUP_TEST_HOST" not in env
    assert env["HANGUP_TEST_URL"] == "http://{host}:8080"  # the pod's own port


def test_notes_speak_to_the_server_in_the_pod(renders: dict[str, Release]) -> None:
    vllm = renders["vllm-serve-values.yaml"].notes
    assert "hangup-sim" not in vllm and '"model": "tiny"' in vllm and "vllm serve" in vllm
    assert "--allow-admin-path" in vllm
    sglang = renders["sglang-values.yaml"].notes
    assert "hangup-sim" not in sglang and "/v1/models" in sglang  # the model asked of it
    triton = renders["triton-values.yaml"].notes
    assert "/v2/models/vllm_model/generate_stream" in triton and "port 8002" in triton
    truss = renders["truss-values.yaml"].notes
    assert "is_disconnected()" in truss and "NetworkPolicy rel-hangup" in truss
    assert "hangup-sim" in renders["default-values.yaml"].notes
    assert "set metrics.labels.release" in renders["triton-values.yaml"].notes
    assert "set metrics.labels.release" not in vllm
    patch = renders["existing-deployment-values.yaml"].notes
    assert "kubectl -n default patch deployment vllm-llama --patch-file patch.yaml" in patch


def test_a_server_of_yours_gets_its_stop_in_the_grace_period(renders: dict[str, Release]) -> None:
    """The grace period holds the server's preStop and then its own stop after SIGTERM
    (modelServer.drainTimeoutSeconds): Truss took 2 s, which a grace period of the preStop and
    the margin alone did not leave it (killed at 8 s, 8.2 s in)."""
    for name in ("vllm-serve-values.yaml", "truss-values.yaml", "existing-deployment-values.yaml"):
        spec = pod_spec(renders[name])
        server = next(c for c in spec["containers"] if c["name"] != "proxy")
        assert spec["terminationGracePeriodSeconds"] == prestop_seconds(server) + 10 + 5, name
    triton = containers(renders["triton-values.yaml"])["triton"]
    assert "--exit-timeout-secs=10" in triton["args"]


@pytest.mark.parametrize("adapter", [a.value for a in AdapterName])
def test_every_adapter_the_proxy_has_is_allowed(helm: HelmEngine, adapter: str) -> None:
    """The proxy's adapters (``--cancel-adapter``), each accepted by the schema and passed on."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    allowed = schema["properties"]["proxy"]["properties"]["cancelAdapter"]["enum"]
    assert set(allowed) == {a.value for a in AdapterName} | {""}
    values = {**scenario("bring-your-own-server-values.yaml"), "proxy": {"cancelAdapter": adapter}}
    assert helm.lint(values).ok
    args = containers(helm.render(values))["proxy"]["args"]
    assert f"--cancel-adapter={adapter}" in args
