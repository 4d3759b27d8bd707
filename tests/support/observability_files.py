"""Reading hangup's dashboard and rules: the expressions they run and the metric names they use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from bench.harness.processes import REPO

DASHBOARD = REPO / "observability" / "grafana" / "hangup-dashboard.json"
RULES = REPO / "observability" / "prometheus" / "rules.yaml"
RULES_TEST = REPO / "observability" / "prometheus" / "rules_test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"

# Grafana's variables, as a live "All" selection expands them.
VARIABLES = {"${datasource}": "", "$__rate_interval": "1m", "$model": ".*", "$pod": ".*"}
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


def panel_queries(board: dict[str, Any] | None = None) -> list[PanelQuery]:
    board = board or dashboard()
    return [
        PanelQuery(p["title"], t.get("legendFormat", ""), t["expr"])
        for p in panels(board)
        for t in p.get("targets", [])
    ]


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The hangup_* metric families an expression reads (histogram suffixes folded away)."""
    return {m for m in METRIC.findall(expr) if not m.endswith("_")}
