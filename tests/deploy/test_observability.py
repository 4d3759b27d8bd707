"""The dashboard and the Prometheus rules, checked by Prometheus' own promtool.

promtool comes from Debian's `prometheus` package (`make k8s-tools` installs it); without it these
tests skip and say so. The end-to-end check against live servers is test_observability_e2e.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.base.processes import REPO
from tests.support.observability_files import (
    ROWS,
    RULES,
    RULES_TEST,
    RUNBOOKS,
    RUNBOOKS_PLACEHOLDER,
    dashboard,
    metric_names,
    panel_queries,
    panels,
    rules,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: `make k8s-tools` installs Debian's prometheus"
)

# The metric families dashboards and alerts may rely on: part of hangup's interface, each one
# documented in a Metrics table of docs/gateway.md or docs/proxy.md.
STABLE_METRICS = {
    "hangup_gateway_requests_total",
    "hangup_gateway_cancellations_total",
    "hangup_gateway_cancel_to_abort_seconds",
    "hangup_gateway_generated_tokens_total",
    "hangup_gateway_wasted_tokens_total",
    "hangup_gateway_cancelled_prompt_tokens_total",
    "hangup_gateway_cancelled_output_tokens_total",
    "hangup_gateway_cancelled_phase_seconds_total",
    "hangup_gateway_inflight_requests",
    "hangup_gateway_time_to_first_token_seconds",
    "hangup_gateway_inter_token_latency_seconds",
    "hangup_gateway_engine_running_requests",
    "hangup_gateway_engine_waiting_requests",
    "hangup_gateway_engine_kv_cache_usage_ratio",
    "hangup_gateway_worker_up",
    "hangup_gateway_engine_restarts_total",
    "hangup_gateway_handoff_kv_blocks",
    "hangup_gateway_handoffs_in_flight",
    "hangup_proxy_requests_total",
    "hangup_proxy_client_disconnects_total",
    "hangup_proxy_cancels_total",
    "hangup_proxy_admin_refusals_total",
    "hangup_proxy_cancel_calls_total",
    "hangup_proxy_disconnect_to_cancel_seconds",
    "hangup_proxy_inflight_requests",
    "hangup_proxy_upstream_time_to_first_byte_seconds",
    "hangup_proxy_worker_restarts_total",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


@needs_promtool
def test_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alerts_pass_their_promtool_unit_tests() -> None:
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_and_one_that_stays_quiet() -> None:
    alerts = {r["alert"] for r in rules() if "alert" in r}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert alerts, "no alerts found"
    assert alerts <= fired, f"alerts never shown firing: {sorted(alerts - fired)}"
    assert alerts <= quiet, f"alerts never shown quiet: {sorted(alerts - quiet)}"


def test_every_alert_links_a_runbook_section_that_exists() -> None:
    headings = {
        re.sub(r"[^a-z0-9-]", "", line[3:].strip().lower().replace(" ", "-"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        if "alert" not in rule:
            continue
        assert "runbook" not in rule["annotations"], rule["alert"]  # runbook_url, which links
        link = rule["annotations"]["runbook_url"]
        page, _, anchor = link.partition("#")
        assert page == RUNBOOKS_PLACEHOLDER, link  # the chart's runbookUrl replaces it
        assert anchor == rule["alert"].lower(), link
        assert anchor in headings, f"{rule['alert']}: no section #{anchor} in {RUNBOOKS.name}"


def test_dashboard_has_datasource_namespace_pod_and_model_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "pod", "model"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod", "model"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    # The sidecar runs beside every server: its series name the namespaces and pods.
    assert variables["namespace"]["query"]["query"].startswith("label_values(hangup_proxy_")
    assert '{namespace=~"$namespace"}' in variables["pod"]["query"]["query"]
    for query in panel_queries():
        assert 'namespace=~"$namespace",pod=~"$pod"' in query.expr, query
    for panel in panels(dashboard()):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_covers_what_an_operator_asks() -> None:
    """The issue's list: hang-ups and cancels by reason, phase and stage; both latencies; wasted
    tokens per second and as a share; tokens spent on cancelled calls by reason (prompt and
    generated: what their usage reports) and the engine time they took by phase; calls in
    flight by phase; cancel-call outcomes; engine capacity (running, waiting, KV cache)."""
    grouped = " ".join(q.expr for q in panel_queries())
    for needle in (
        "by (protocol, stage) (rate(hangup_proxy_client_disconnects_total",
        "by (reason) (rate(hangup_gateway_cancellations_total",
        "by (phase) (rate(hangup_gateway_cancellations_total",
        "rate(hangup_proxy_disconnect_to_cancel_seconds_bucket",
        "rate(hangup_gateway_cancel_to_abort_seconds_bucket",
        "rate(hangup_gateway_wasted_tokens_total",
        "by (reason) (rate(hangup_gateway_cancelled_prompt_tokens_total",
        "by (reason) (rate(hangup_gateway_cancelled_output_tokens_total",
        "by (phase) (rate(hangup_gateway_cancelled_phase_seconds_total",
        "by (phase) (hangup_gateway_inflight_requests",
        "by (adapter, result) (rate(hangup_proxy_cancel_calls_total",
        "hangup_gateway_engine_running_requests",
        "hangup_gateway_engine_waiting_requests",
        "hangup_gateway_engine_kv_cache_usage_ratio",
        "increase(hangup_gateway_engine_restarts_total",
    ):
        assert needle in grouped, needle
    share = [q for q in panel_queries() if "wasted_tokens_total" in q.expr and "/" in q.expr]
    assert share, "no wasted-token share panel"


def test_each_row_reads_only_its_servers_metrics() -> None:
    """A panel's id says its row (the chart keeps the rows of its `server`): the sidecar's rows
    read only the proxy's metrics, the gateway's the gateway's (and the proxy's, for a ratio),
    vLLM's `vllm:*`, Triton's `nv_*`; each row opens with its row panel."""
    reads = {1: ("hangup_proxy_",), 2: ("hangup_gateway_", "hangup_proxy_"), 3: ("vllm:",),
             4: ("nv_",)}  # fmt: skip
    board = list(panels(dashboard()))
    rows_seen = [p["id"] // 100 for p in board if p["type"] == "row"]
    assert rows_seen == list(ROWS), rows_seen
    current = 0
    for panel in board:
        if panel["type"] == "row":
            current = panel["id"] // 100
            assert panel["id"] % 100 == 0, panel["title"]
            continue
        assert panel["id"] // 100 == current, (panel["id"], panel["title"])
        for target in panel["targets"]:
            names = re.findall(r"\b(hangup_[a-z_]+|vllm:[a-z_:]+|nv_[a-z_]+)", target["expr"])
            assert names, target["expr"]
            for name in names:
                assert name.startswith(reads[current]), (panel["title"], name)
    assert len({p["id"] for p in board}) == len(board), "panel ids repeat"


def test_dashboard_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels(dashboard()):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel query (variables expanded) as a recording rule expression."""
    queries = panel_queries()
    doc = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": q.promql()}
                    for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(queries)} rules found" in result.stdout


def test_dashboard_and_rules_use_only_stable_documented_metric_names() -> None:
    used = set().union(*(metric_names(q.expr) for q in panel_queries()))
    used |= set().union(*(metric_names(r["expr"]) for r in rules()))
    assert used, "no metric names found"
    assert used <= STABLE_METRICS, f"not stable: {sorted(used - STABLE_METRICS)}"
    pages = "".join((REPO / "docs" / page).read_text() for page in ("gateway.md", "proxy.md"))
    documented = set(re.findall(r"^\| `(hangup_\w+)` \|", pages, re.M))
    assert documented >= STABLE_METRICS, f"not documented: {sorted(STABLE_METRICS - documented)}"
