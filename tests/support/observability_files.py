"""Reading hangup's dashboard and rules: the expressions they run and the metric names they use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from bench.base.processes import REPO

DASHBOARD = REPO / "observability" / "grafana" / "hangup-dashboard.json"
RULES = REPO / "observability" / "prometheus" / "rules.yaml"
RULES_TEST = REPO / "observability" / "prometheus" / "rules_test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOKS_PLACEHOLDER = "https://hangup.invalid/runbooks.md"
"""Where rules.yaml says the runbooks are; the chart puts metrics.prometheusRule.runbookUrl here."""
ROWS = {1: "the sidecar", 2: "hangup's gateway", 3: "vLLM", 4: "Triton"}
"""The dashboard's rows by the hundreds of their panels' ids (the chart keeps its server's)."""

# Grafana's variables, as a live "All" selection expands them.
VARIABLES = {
    "${datasource}": "", "$__rate_interval": "1m", "$model": ".*", "$pod": ".*", "$namespace": ".*",
}  # fmt: skip
METRIC = re.compile(r"\b(hangup_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?!\s*[(:])")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    legend: str
    expr: str

    def promql(self) -> str:
        """The expression with the dashboard's variables expanded as Grafana would for "All"."""
        expr = self.expr
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        return expr


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries(
    board: dict[str, Any] | None = None, rows: tuple[int, ...] = tuple(ROWS)
) -> list[PanelQuery]:
    """Every query of the panels in ``rows`` (the hundreds of their ids)."""
    board = board or dashboard()
    return [
        PanelQuery(p["title"], t.get("legendFormat", ""), t["expr"])
        for p in panels(board)
        if p["id"] // 100 in rows
        for t in p.get("targets", [])
    ]


def server_metric_names(expr: str, prefix: str) -> set[str]:
    """The series names of another server an expression reads (``vllm:``, ``nv_``), as written
    (a histogram's with its ``_bucket``)."""
    return set(re.findall(rf"\b({re.escape(prefix)}[a-zA-Z0-9_:]+)\b(?![(])", expr))


def exported(name: str, families: set[str]) -> bool:
    """Whether a series ``name`` belongs to one of ``families`` (a histogram's ``_bucket``,
    ``_sum`` and ``_count``, a counter's ``_total``, are its family's)."""
    return name in families or re.sub(r"_(bucket|sum|count|total)$", "", name) in families


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The hangup_* metric families an expression reads (histogram suffixes folded away)."""
    return {m for m in METRIC.findall(expr) if not m.endswith("_")}
