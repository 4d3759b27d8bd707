"""charts/hangup through Helm's own engine: lint every ci/ scenario, then read what it renders.

The engine is a `helm` binary when one is on PATH, else helm-sdkpy (`make k8s-tools` builds
.venv-helm). helm-sdkpy has no `template` command, so rendering runs its install action against
the RecordingKubeAPI of tests/support/helm_engine.py: a stand-in API server on loopback, not a
cluster. The manifest, hooks and notes come from Helm's real engine; nothing is scheduled or
admitted, and CRD schemas (ServiceMonitor, PrometheusRule) are not validated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway_server.config import from_args
from proxy.config import build_config
from tests.support.chart import CHART, HelmEngine, Release, scenario, scenarios
from tests.support.observability_files import DASHBOARD, RULES


def containers(release: Release) -> dict[str, dict[str, Any]]:
    """The pod's containers by name, a native sidecar's (an init container) among them; for a
    Deployment of the user's, what the patch adds or changes."""
    spec = pod_spec(release)
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec.get("containers", [])]}


def pod_spec(release: Release) -> dict[str, Any]:
    return dict(release.one("Deployment")["spec"]["template"]["spec"])


def proxy_ports(release: Release) -> set[str | int]:
    """The proxy's ports, by name and by number (a native sidecar's are named by number)."""
    ports = containers(release)["proxy"]["ports"]
    return {p["name"] for p in ports} | {p["containerPort"] for p in ports}


def flag(container: dict[str, Any], name: str) -> str | None:
    for arg in container.get("args", []):
        if arg.startswith(f"--{name}="):
            return str(arg.split("=", 1)[1])
    return None


def main_service(release: Release) -> dict[str, Any]:
    """The release's Service (not the headless one an edge's cancel pool resolves)."""
    (service,) = [s for s in release.find("Service") if s["spec"].get("clusterIP") != "None"]
    return service


def prestop_seconds(container: dict[str, Any]) -> int:
    if "lifecycle" not in container:
        return 0
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def test_scenarios_exist() -> None:
    assert {"default-values.yaml", "full-values.yaml", "bring-your-own-server-values.yaml"} <= set(
        scenarios()
    )


@pytest.mark.parametrize("name", scenarios())
def test_lint_is_clean(helm: HelmEngine, name: str) -> None:
    result = helm.lint(scenario(name))
    assert result.ok and not result.problems(), f"{helm.name}: {result.messages}"


@pytest.mark.parametrize(
    "values",
    [
        {"gateway": {"engine": "tensorrt"}},
        {"server": "custom"},
        {"server": "custom", "modelServer": {"container": {"name": "x", "image": "y"}}},
        {"server": "vllm-serve"},
        {"server": "nginx"},
        {"proxy": {"cancelAdapter": "vllm"}},
        {"server": "vllm-serve", "existingDeployment": {"name": "mine"}},
        {"gateway": {"enabled": False}},
        {"proxy": {"cancelAdapter": "envoy"}},
        {"service": {"httpPort": 0}},
        {"metrics": {"serviceMonitor": {"interval": "often"}}},
        {"gateway": {"unknownKey": 1}},
        {"proxy": {"workers": -1}},
        {"gateway": {"workers": 2, "workerRoles": "prefill,encode"}},
    ],
    ids=[
        "unknown-engine",
        "custom-without-a-server",
        "custom-without-an-adapter",
        "preset-without-an-image",
        "unknown-server",
        "gateway-with-another-adapter",
        "existing-deployment-without-selector",
        "gateway-enabled-is-gone",
        "unknown-adapter",
        "port-zero",
        "bad-interval",
        "unknown-key",
        "negative-workers",
        "unknown-worker-role",
    ],
)
def test_schema_rejects_bad_values(helm: HelmEngine, values: dict[str, Any]) -> None:
    assert not helm.lint(values).ok


@pytest.mark.parametrize("name", scenarios())
def test_every_scenario_renders(renders: dict[str, Release], name: str) -> None:
    release = renders[name]
    assert release.ok, release.error
    assert release.one("Deployment") and main_service(release)


@pytest.mark.parametrize("name", scenarios())
def test_only_the_proxy_is_exposed(renders: dict[str, Release], name: str) -> None:
    """Every Service port leads to the proxy, but Triton's metrics port (read-only /metrics);
    a server the chart writes has no other port and listens on 127.0.0.1."""
    release = renders[name]
    by_name = containers(release)
    server_metrics = {8002} if scenario(name).get("server") == "triton" else set()
    for service in release.find("Service"):
        targets = {p["targetPort"] for p in service["spec"]["ports"]}
        assert targets <= proxy_ports(release) | server_metrics, targets
    for server in (c for n, c in by_name.items() if n != "proxy" and "image" in c):
        assert [p["name"] for p in server.get("ports", [])] == ["server-metrics"] * len(
            server_metrics
        ), server.get("ports")
        preset = scenario(name).get("server", "gateway")
        if preset in ("vllm-serve", "sglang", "triton") and "existing" not in name:
            address = "--http-address" if preset == "triton" else "--host"
            assert server["args"][-1 if preset != "triton" else 0].startswith("--")
            assert f"{address}=127.0.0.1" in server["args"], server["args"]
    if "gateway" in by_name:
        gateway = by_name["gateway"]
        assert "ports" not in gateway
        assert flag(gateway, "host") == "127.0.0.1"
        assert (
            flag(by_name["proxy"], "upstream-http")
            == f"http://127.0.0.1:{flag(gateway, 'http-port')}"
        )
        grpc = flag(by_name["proxy"], "upstream-grpc") or ""
        assert all(address.startswith("127.0.0.1:") for address in grpc.split(","))


def test_worker_roles_reach_the_gateway_as_it_parses_them(renders: dict[str, Release]) -> None:
    for name, roles in (("default-values.yaml", None), ("disaggregated-values.yaml", "P,D,D")):
        gateway = containers(renders[name])["gateway"]
        assert flag(gateway, "worker-roles") == (roles and "prefill,decode,decode")
        args = [a for a in gateway["args"] if not a.startswith("--cancel-token-file=")]
        config = from_args(args, {})
        assert "".join(r.value[0].upper() for r in config.roles) == (roles or "B").replace(",", "")


@pytest.mark.parametrize("name", scenarios())
def test_every_scenario_starts_the_proxy_and_the_gateway_with_flags_they_take(
    renders: dict[str, Release], name: str
) -> None:
    """Each container of ours parses its rendered arguments as its command line does (a flag
    it does not know, a value its flag does not take, are refused at start)."""
    ours = {"proxy": build_config, "gateway": lambda args, env: from_args(args, env)}
    for container_name, parse in ours.items():
        container = containers(renders[name]).get(container_name)
        if container is None or not container.get("args"):
            continue
        args = [a for a in container["args"] if not a.startswith("--cancel-token-file=")]
        parse(args, {})


@pytest.mark.parametrize("name", scenarios())
def test_cancel_token_is_wired_to_both_containers(renders: dict[str, Release], name: str) -> None:
    release = renders[name]
    by_name = containers(release)
    proxy = by_name["proxy"]
    preset = scenario(name).get("server", "gateway") not in ("gateway", "custom")
    if flag(proxy, "cancel-adapter") != "hangup" and not preset:
        assert flag(proxy, "cancel-token-file") is None
        return
    volume = next(v for v in pod_spec(release)["volumes"] if v["name"] == "cancel-token")
    secret_name = volume["secret"]["secretName"]
    readers = [c for c in by_name.values() if flag(c, "cancel-token-file")]
    assert {c["name"] for c in readers} == {"gateway", "proxy"} & set(by_name)
    for container in readers:
        mount = next(m for m in container["volumeMounts"] if m["name"] == "cancel-token")
        path = Path(flag(container, "cancel-token-file") or "")
        assert str(path.parent) == mount["mountPath"] and mount["readOnly"]
        key = path.name
    secrets = {s["metadata"]["name"]: s for s in release.find("Secret")}
    if scenario(name).get("cancelToken", {}).get("existingSecret"):
        assert secret_name == scenario(name)["cancelToken"]["existingSecret"]
        assert not secrets, "a Secret was generated though the user named their own"
        assert key == scenario(name)["cancelToken"].get("key", "token")
    else:
        token = secrets[secret_name]["data"][key]
        assert len(token) >= 40


def test_each_install_generates_a_fresh_token(helm: HelmEngine) -> None:
    tokens = {helm.render({}).one("Secret")["data"]["token"] for _ in range(2)}
    assert len(tokens) == 2


def test_an_upgrade_keeps_the_token_already_in_the_cluster(helm: HelmEngine) -> None:
    """Running pods read the token from the Secret: an upgrade must not replace it."""
    if helm.helm:
        pytest.skip("a `helm` binary's client-only dry run cannot look up cluster objects")
    first = helm.render({}).one("Secret")
    # As the first install left it: in the namespace, owned by the release.
    first["metadata"]["namespace"] = "default"
    first["metadata"]["annotations"] = {
        "meta.helm.sh/release-name": "rel", "meta.helm.sh/release-namespace": "default",
    }  # fmt: skip
    again = helm.render({}, existing=[first])
    assert again.ok, again.error
    assert again.one("Secret")["data"]["token"] == first["data"]["token"]


@pytest.mark.parametrize("name", scenarios())
def test_shutdown_order_lets_the_proxy_cancel_before_the_upstream_stops(
    renders: dict[str, Release], name: str
) -> None:
    """preStop and terminationGracePeriodSeconds agree with the drain timeouts: the upstream keeps
    serving until the proxy has drained and cancelled, and the kubelet kills nobody before that."""
    release = renders[name]
    by_name = containers(release)
    proxy = by_name["proxy"]
    grace = pod_spec(release)["terminationGracePeriodSeconds"]
    if proxy.get("restartPolicy") == "Always":  # a native sidecar: the kubelet stops it last
        assert proxy in pod_spec(release)["initContainers"] and "lifecycle" not in proxy
    # Drained, then every shutdown cancel answered or given up on.
    proxy_done = (
        prestop_seconds(proxy)
        + int(flag(proxy, "drain-timeout") or 0)
        + int(flag(proxy, "cancel-deadline") or 0)
    )
    if list(by_name) == ["proxy"]:  # an edge: its upstream is outside the pod
        assert grace >= proxy_done
        return
    upstream = by_name.get("gateway") or next(c for n, c in by_name.items() if n != "proxy")
    assert prestop_seconds(upstream) >= proxy_done
    # Then the server stops: the gateway's drain, or a server of the user's its own time.
    values = scenario(name)
    server_drain = (
        int(flag(upstream, "drain-timeout") or 0)
        if "gateway" in by_name
        else int(values.get("modelServer", {}).get("drainTimeoutSeconds", 10))
    )
    assert grace >= prestop_seconds(upstream) + server_drain


def test_a_grace_period_too_short_for_the_drain_is_refused(helm: HelmEngine) -> None:
    release = helm.render({"shutdown": {"terminationGracePeriodSeconds": 20}})
    assert not release.ok
    assert "shorter than the 55s the pod needs to drain" in release.error


def test_probes_watch_proxy_health_and_gateway_health(renders: dict[str, Release]) -> None:
    by_name = containers(renders["default-values.yaml"])
    proxy, gateway = by_name["proxy"], by_name["gateway"]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    # The gateway is on loopback, out of the kubelet's reach: its probes run inside the pod.
    assert "/v2/health/ready" in " ".join(gateway["readinessProbe"]["exec"]["command"])
    assert "/v2/health/live" in " ".join(gateway["livenessProbe"]["exec"]["command"])
    assert "/v2/health/live" in " ".join(gateway["startupProbe"]["exec"]["command"])


def test_defaults_create_no_optional_objects(renders: dict[str, Release]) -> None:
    kinds = {o["kind"] for o in renders["default-values.yaml"].objects()}
    assert kinds == {"ServiceAccount", "Secret", "Service", "Deployment"}


def test_full_scenario_creates_every_optional_object(renders: dict[str, Release]) -> None:
    kinds = {o["kind"] for o in renders["full-values.yaml"].objects()}
    assert {
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
    } <= kinds
    assert "replicas" not in renders["full-values.yaml"].one("Deployment")["spec"]  # the HPA's


def test_network_policy_lets_clients_and_prometheus_in_and_nothing_else(
    renders: dict[str, Release],
) -> None:
    policy = renders["full-values.yaml"].one("NetworkPolicy")
    clients, scrapers = policy["spec"]["ingress"]
    assert {p["port"] for p in clients["ports"]} == {"http", "grpc"}
    assert "from" not in clients  # clientFrom is empty: any client
    assert {p["port"] for p in scrapers["ports"]} == {"admin", "http"}
    namespace = scrapers["from"][0]["namespaceSelector"]["matchLabels"]
    assert namespace == {"kubernetes.io/metadata.name": "monitoring"}


def test_gpus_go_to_the_gateway_only(renders: dict[str, Release]) -> None:
    by_name = containers(renders["full-values.yaml"])
    assert by_name["gateway"]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert by_name["gateway"]["resources"]["limits"]["memory"] == "32Gi"
    assert "nvidia.com/gpu" not in json.dumps(by_name["proxy"])
    shm = next(
        v for v in pod_spec(renders["full-values.yaml"])["volumes"] if v["name"] == "gateway-shm"
    )
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "gateway-shm", "mountPath": "/dev/shm"} in by_name["gateway"]["volumeMounts"]
    default_volumes = pod_spec(renders["default-values.yaml"])["volumes"]
    assert "gateway-shm" not in {v["name"] for v in default_volumes}


def test_dashboard_configmap_appears_only_when_enabled(renders: dict[str, Release]) -> None:
    assert not renders["default-values.yaml"].find("ConfigMap")
    configmap = renders["full-values.yaml"].one("ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_prometheus_rule_ships_the_observability_rules(renders: dict[str, Release]) -> None:
    assert not renders["default-values.yaml"].find("PrometheusRule")
    rule = renders["full-values.yaml"].one("PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert "set metrics.prometheusRule.runbookUrl" in renders["full-values.yaml"].notes


def test_chart_files_are_links_to_the_observability_sources() -> None:
    """One source of truth: Helm follows these links (and `helm package` stores their content)."""
    for name, source in (("hangup-dashboard.json", DASHBOARD), ("hangup-rules.yaml", RULES)):
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} should link to {source}"
        assert Path(os.path.realpath(link)) == source.resolve()


def test_packaged_chart_carries_the_dashboard_and_rules_themselves(
    helm: HelmEngine, tmp_path: Path
) -> None:
    """`helm package` stores the linked files' content: the archive needs no checkout beside it."""
    archive = helm.package(tmp_path)
    with tarfile.open(archive) as tar:
        for name, source in (("hangup-dashboard.json", DASHBOARD), ("hangup-rules.yaml", RULES)):
            member = tar.getmember(f"hangup/files/{name}")
            assert member.isfile(), f"{name} is packaged as a link"
            extracted = tar.extractfile(member)
            assert extracted is not None and extracted.read() == source.read_bytes()


def test_service_monitor_scrapes_proxy_and_gateway_through_the_proxy(
    renders: dict[str, Release],
) -> None:
    monitor = renders["full-values.yaml"].one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    triton = renders["triton-values.yaml"].one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert {(e["port"], e["path"]) for e in triton} == {
        ("admin", "/metrics"),
        ("server-metrics", "/metrics"),
    }
    endpoints = {(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]}
    assert endpoints == {("admin", "/metrics"), ("http", "/metrics")}
    service = main_service(renders["full-values.yaml"])
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {port for port, _ in endpoints} <= service_ports
    selects = monitor["spec"]["selector"]
    for candidate in renders["full-values.yaml"].find("Service"):  # each pod scraped once
        labels = candidate["metadata"]["labels"]
        chosen = selects["matchLabels"].items() <= labels.items() and all(
            labels.get(e["key"]) not in e["values"] for e in selects["matchExpressions"]
        )
        name = candidate["metadata"]["name"]
        assert chosen == (name == service["metadata"]["name"]), name


def test_bring_your_own_model_server(renders: dict[str, Release]) -> None:
    release = renders["bring-your-own-server-values.yaml"]
    by_name = containers(release)
    assert set(by_name) == {"vllm", "proxy"}
    assert by_name["vllm"]["image"] == "vllm/vllm-openai:v0.32.0"
    assert flag(by_name["proxy"], "cancel-adapter") == "vllm"
    assert "--vllm-abort-endpoint" not in by_name["proxy"]["args"]  # dev mode is opt-in
    assert flag(by_name["proxy"], "upstream-http") == "http://127.0.0.1:8000"
    assert flag(by_name["proxy"], "upstream-grpc") is None
    assert not release.find("Secret")
    assert {p["name"] for p in release.one("Service")["spec"]["ports"]} == {"http", "admin"}
    assert release.one("PodMonitor")


@pytest.mark.parametrize(
    ("proxy", "abort_flag"),
    [({"cancelAdapter": "vllm", "vllmAbortEndpoint": True}, True),
     ({"cancelAdapter": "sglang"}, False)],
)  # fmt: skip
def test_the_adapters_for_other_servers_reach_the_proxy(
    helm: HelmEngine, proxy: dict[str, Any], abort_flag: bool
) -> None:
    values = {**scenario("bring-your-own-server-values.yaml"), "proxy": proxy}
    release = helm.render(values)
    assert release.ok, release.error
    container = containers(release)["proxy"]
    assert flag(container, "cancel-adapter") == proxy["cancelAdapter"]
    assert ("--vllm-abort-endpoint" in container["args"]) is abort_flag


def test_pods_behind_an_edge_resolve_by_one_name_and_keep_the_edges_id(
    renders: dict[str, Release],
) -> None:
    release = renders["full-values.yaml"]
    headless = [s for s in release.find("Service") if s["metadata"]["name"].endswith("-pods")]
    (service,) = headless
    assert service["spec"]["clusterIP"] == "None"
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert (
        service["spec"]["selector"] == release.one("Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert "--trust-client-request-id" in containers(release)["proxy"]["args"]
    assert (
        "--trust-client-request-id"
        not in containers(renders["default-values.yaml"])["proxy"]["args"]
    )


def test_an_edge_runs_the_proxy_alone_with_its_cancel_pool(renders: dict[str, Release]) -> None:
    release = renders["edge-values.yaml"]
    assert list(containers(release)) == ["proxy"]
    proxy = containers(release)["proxy"]
    assert flag(proxy, "upstream-http") == "http://litellm.llm.svc:4000"
    assert flag(proxy, "cancel-pool") == "http://hangup-pods.llm.svc:8080"
    assert flag(proxy, "cancel-token-file") is not None  # the pods' token, from their Secret
    volumes = {v["name"]: v for v in pod_spec(release)["volumes"]}
    assert volumes["cancel-token"]["secret"]["secretName"] == "hangup-cancel-token"


def test_helm_test_hook_streams_through_the_service(renders: dict[str, Release]) -> None:
    release = renders["default-values.yaml"]
    (pod,) = [o for o in release.hook_objects() if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    service = release.one("Service")["metadata"]["name"]
    assert env["HANGUP_TEST_HOST"] == service
    assert env["HANGUP_TEST_URL"] == "http://{host}:8080"
    assert env["HANGUP_TEST_ADMIN_URL"] == "http://{host}:9090"
    script = pod["spec"]["containers"][0]["args"][0]
    assert script == (CHART / "files" / "helm-test.py").read_text()


def test_notes_tell_how_to_reach_and_watch_the_release(renders: dict[str, Release]) -> None:
    notes = renders["full-values.yaml"].notes
    assert "port-forward svc/rel-hangup 8080:8080 9090:9090" in notes
    assert "helm test rel" in notes
    assert "ServiceMonitor rel-hangup" in notes and "Grafana" in notes


def test_chart_command_line_starts_the_real_gateway_and_its_probes_pass(
    renders: dict[str, Release], tmp_path: Path
) -> None:
    """The gateway container's command and args, as rendered, run the real `hangup-gateway`
    (ports moved to 0, the token path to a temporary file); its exec probes then pass."""
    from bench.base.processes import spawn

    gateway = containers(renders["default-values.yaml"])["gateway"]
    assert gateway["command"] == ["hangup-gateway"]
    token = tmp_path / "token"
    token.write_text("a-token-for-this-test")
    moved = {"http-port": "0", "grpc-port": "0", "cancel-token-file": str(token)}
    args = []
    for arg in gateway["args"]:
        name = arg.removeprefix("--").split("=", 1)[0]
        args.append(f"--{name}={moved[name]}" if name in moved else arg)
    with spawn("gateway_server", args, tmp_path) as process:
        http = process.listeners["http"]
        assert http.startswith("127.0.0.1:")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            command = [
                part.replace(f"127.0.0.1:{flag(gateway, 'http-port')}", http)
                for part in gateway[probe]["exec"]["command"]
            ]
            assert command[0] == "python3"
            done = subprocess.run(
                [sys.executable, *command[1:]], capture_output=True, text=True, timeout=30
            )
            assert done.returncode == 0, f"{probe}: {done.stderr}"
        assert process.terminate() == 0


def test_proxy_workers_follow_its_cpu_limit_unless_set(
    renders: dict[str, Release], helm: HelmEngine
) -> None:
    assert flag(containers(renders["default-values.yaml"])["proxy"], "workers") == "1"  # no limit
    assert flag(containers(renders["full-values.yaml"])["proxy"], "workers") == "2"  # 1500m
    whole = helm.render({"proxy": {"resources": {"limits": {"cpu": "4"}}}})
    assert flag(containers(whole)["proxy"], "workers") == "4"
    chosen = helm.render({"proxy": {"workers": 3, "resources": {"limits": {"cpu": "8"}}}})
    assert flag(containers(chosen)["proxy"], "workers") == "3"


def test_gateway_api_processes_are_passed_and_bounded_by_its_workers(
    renders: dict[str, Release], helm: HelmEngine
) -> None:
    one, two = containers(renders["default-values.yaml"]), containers(renders["full-values.yaml"])
    assert flag(one["gateway"], "api-processes") == "1"
    assert flag(one["gateway"], "grpc-process-ports") is None
    assert flag(one["proxy"], "upstream-grpc") == "127.0.0.1:8001"
    # Two API processes: each serves gRPC on a port of its own, and the proxy spreads its gRPC
    # calls over both (its one connection to the shared port would reach one process).
    assert flag(two["gateway"], "api-processes") == "2"
    assert flag(two["gateway"], "grpc-process-ports") == "8100"
    assert flag(two["proxy"], "upstream-grpc") == "127.0.0.1:8100,127.0.0.1:8101"
    release = helm.render({"gateway": {"workers": 2, "apiProcesses": 3}})
    assert not release.ok
    assert "gateway.apiProcesses=3 is more than gateway.workers=2" in release.error


def test_chart_command_line_starts_the_real_proxy_and_its_probes_pass(
    renders: dict[str, Release], tmp_path: Path
) -> None:
    """The proxy container's command and args, as rendered, run the real `hangup-proxy` in front
    of a real gateway (ports moved to 0, listening on loopback here); its HTTP probes pass."""
    import urllib.request

    from bench.base.processes import spawn

    proxy = containers(renders["default-values.yaml"])["proxy"]
    assert proxy["command"] == ["hangup-proxy"]
    token = tmp_path / "token"
    token.write_text("a-token-for-this-test")
    gateway_args = ["--http-port", "0", "--grpc-port", "0", "--cancel-token-file", str(token)]
    with spawn("gateway_server", gateway_args, tmp_path / "gateway") as gateway:
        moved = {
            "host": "127.0.0.1", "http-port": "0", "grpc-port": "0", "admin-port": "0",
            "upstream-http": gateway.url("http"), "upstream-grpc": gateway.listeners.get("grpc"),
            "cancel-token-file": str(token),
        }  # fmt: skip
        args = []
        for arg in proxy["args"]:
            name = arg.removeprefix("--").split("=", 1)[0]
            if name in moved and moved[name] is None:  # no gRPC listener on this gateway yet
                continue
            args.append(f"--{name}={moved[name]}" if name in moved else arg)
        with spawn("proxy", args, tmp_path / "proxy") as process:
            for probe in ("livenessProbe", "readinessProbe"):
                get = proxy[probe]["httpGet"]
                assert get["port"] == "admin"
                url = f"{process.url('admin')}{get['path']}"
                with urllib.request.urlopen(url, timeout=10) as resp:
                    assert resp.status == 200, f"{probe}: {url}"
            assert process.terminate() == 0
