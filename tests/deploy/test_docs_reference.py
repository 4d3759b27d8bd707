"""The docs' references against their sources (``tests/support/references.py`` reads both): the
flag tables of docs/proxy.md and docs/gateway.md against the commands' option tables (every
flag, under ``--help``'s section, with its default), the Metrics tables against the metrics the
code declares (both ways, with their labels), every metric a page names, and the chart README's
Values table against ``values.schema.json`` and ``values.yaml``. A failure names each drift;
``python -m tests.support.references`` prints the same. Each check is also shown to fail on a
page made wrong on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway_server.config import OPTION_TABLE as GATEWAY
from gateway_server.metrics.gateway import GatewayMetrics
from hangup_contract.runtime.options import OptionTable
from proxy.config import OPTION_TABLE as PROXY
from proxy.metrics import ProxyMetrics, SupervisorMetrics
from tests.support.references import (
    CHART,
    REPO,
    declared_metrics,
    flag_drift,
    metric_drift,
    named_metrics,
    values_drift,
)

DOCS = REPO / "docs"
PAGES = {"proxy.md": PROXY, "gateway.md": GATEWAY}
METRIC_PAGES = [DOCS / "proxy.md", DOCS / "gateway.md"]
DECLARED = declared_metrics("proxy", "gateway_server", "hangup_contract")


def lines(drift: list[str]) -> str:
    return "\n".join(["", *drift])


@pytest.mark.parametrize("page", PAGES)
def test_each_flag_table_holds_every_flag_under_its_section_with_its_default(page: str) -> None:
    drift = flag_drift(DOCS / page, PAGES[page])
    assert not drift, lines(drift)


def test_the_metrics_tables_hold_every_metric_the_code_exports_and_no_other() -> None:
    drift = [
        *metric_drift(METRIC_PAGES, DECLARED, "hangup_"),
        *metric_drift([DOCS / "gateway.md"], DECLARED, "vllm:"),
    ]
    assert not drift, lines(drift)


def test_every_metric_a_page_names_is_exported() -> None:
    pages = [*sorted(DOCS.glob("*.md")), REPO / "README.md", CHART / "README.md"]
    unknown = [
        f"{page.relative_to(REPO)}: {name}"
        for page in pages
        for name in sorted(named_metrics(page.read_text()))
        if name not in DECLARED
    ]
    assert not unknown, lines(unknown)


def test_the_scan_of_the_source_finds_every_metric_the_registries_hold() -> None:
    """The declarations are read from the source (a metric made in any mode, by any process),
    so this holds the reading to what the registries really export."""
    registry = CollectorRegistry()
    ProxyMetrics(registry)
    SupervisorMetrics(CollectorRegistry())
    GatewayMetrics(registry, ["model"])
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in registry.collect()
    }
    assert len(exported) > 30
    assert exported <= set(DECLARED), sorted(exported - set(DECLARED))
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k not in ("le",)}
        assert labels <= set(DECLARED[name].labels or labels), name


def test_the_chart_values_table_holds_every_value_with_its_default() -> None:
    drift = values_drift(CHART / "README.md")
    assert not drift, lines(drift)


# -- each check fails on a page made wrong ------------------------------------------------------


def wrong_copy(tmp_path: Path, page: Path, *edits: tuple[str, str]) -> Path:
    text = page.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    copy = tmp_path / page.name
    copy.write_text(text)
    return copy


@pytest.mark.parametrize(("page", "table"), [("proxy.md", PROXY)])
def test_the_flag_check_names_a_missing_flag_a_wrong_default_an_unknown_flag_and_a_wrong_section(
    tmp_path: Path, page: str, table: OptionTable
) -> None:
    text = (DOCS / page).read_text()
    drain = next(line for line in text.splitlines() if line.startswith("| `--drain-timeout` |"))
    copy = wrong_copy(
        tmp_path,
        DOCS / page,
        (drain + "\n", ""),
        ("| `--http-port` | `8080` |", "| `--http-port` | `8000` |"),
        ("| `--host` |", "| `--hostname` |"),
        ("| `--log-level` |", drain.replace("drain-timeout", "workers") + "\n| `--log-level` |"),
    )
    drift = lines(flag_drift(copy, table))
    assert "--drain-timeout is not documented; under '### Listeners' add:" in drift
    assert "--http-port: the default is '`8080`' (documented: '`8000`')" in drift
    assert "--hostname is documented but hangup-proxy has no such flag" in drift
    assert "--workers is under 'Observability'; hangup-proxy --help has it under 'Lis" in drift


def test_the_metric_check_names_a_metric_undocumented_unknown_or_with_other_labels(
    tmp_path: Path,
) -> None:
    copy = wrong_copy(
        tmp_path,
        DOCS / "proxy.md",
        ("| `hangup_proxy_scrapes_total` |", "| `hangup_proxy_scrape_total` |"),
        ("| `hangup_proxy_held_ids` | kind |", "| `hangup_proxy_held_ids` | kind, worker |"),
    )
    drift = lines(metric_drift([copy, DOCS / "gateway.md"], DECLARED, "hangup_"))
    assert "hangup_proxy_scrapes_total (proxy/metrics.py:" in drift
    assert "hangup_proxy_scrape_total is documented but no code declares it" in drift
    assert "hangup_proxy_held_ids's labels are kind (documented: kind, worker)" in drift


def test_the_values_check_names_a_value_missing_unknown_or_with_another_default(
    tmp_path: Path,
) -> None:
    copy = wrong_copy(
        tmp_path,
        CHART / "README.md",
        ("| `replicaCount` | `1` |", "| `replicaCount` | `2` |"),
        ("| `proxy.workers` | `0` |", "| `proxy.processes` | `0` |"),
    )
    drift = lines(values_drift(copy))
    assert "replicaCount: the default is '`1`' (documented: '`2`')" in drift
    assert "proxy.processes is not a value of values.schema.json" in drift
    assert "proxy.workers is not documented" in drift
