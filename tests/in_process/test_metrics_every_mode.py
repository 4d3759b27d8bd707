"""Every metric a Prometheus rule or a dashboard panel reads is exported by a one-process gateway
and a one-process proxy, from the start (the end-to-end test in tests/deploy covers the
multi-process proxy under load): an alert on a family that a mode never exports would stay quiet
for good in that mode."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import running_gateway
from tests.support.observability_files import metric_names, panel_queries, rules
from tests.support.proxy_harness import running_proxy


def used_names() -> set[str]:
    used = set().union(*(metric_names(q.expr) for q in panel_queries()))
    return used | set().union(*(metric_names(r["expr"]) for r in rules() if "expr" in r))


async def exported(session: aiohttp.ClientSession, url: str) -> set[str]:
    """The families ``url`` declares (a labelled counter with no series yet counts: its family
    is there, and its first series appears with its first event)."""
    async with session.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


async def test_one_process_gateway_and_proxy_export_every_metric_rules_and_panels_use() -> None:
    used = used_names()
    assert "hangup_gateway_engine_restarts_total" in used
    assert "hangup_proxy_worker_restarts_total" in used
    async with running_gateway() as gw, running_proxy(gw.url) as proxy:
        gateway = await exported(gw.session, f"{gw.url}/metrics")
        missing = {n for n in used if n.startswith("hangup_gateway_")} - gateway
        assert not missing, f"a one-process gateway does not export: {sorted(missing)}"
        admin = f"http://{proxy.addresses['admin']}/metrics"
        missing = {n for n in used if n.startswith("hangup_proxy_")} - await exported(
            gw.session, admin
        )
        assert not missing, f"a one-process proxy does not export: {sorted(missing)}"
