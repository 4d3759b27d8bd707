"""hangup's gateway behind the sidecar (``--cancel-adapter hangup``, the default): its admin API
(``/v2/admin/...``, the simulated engine's fault switch with ``--sim-faults``) is the operator's,
straight to the gateway inside the pod; through the sidecar it is refused even with the token (a
client holding the token may cancel calls, never kill an engine). The cancel API, the call list,
metrics and health stay reachable through the sidecar.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from bench.base.scrape import metric_sum
from bench.harness.stack import MODEL, TOKEN, Stack, running_stack

AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAULT = "/v2/admin/workers/0/fault"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("gateway-admin"), ["--sim-faults"]) as stack:
        yield stack


def send(
    base: str, method: str, target: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """``target`` sent exactly as written (no client library normalizes it)."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        fields = {**({"Content-Type": "application/json"} if data else {}), **(headers or {})}
        connection.request(method, target, body=data, headers=fields)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def restarts(stack: Stack) -> float:
    return metric_sum(stack.gateway_url, "hangup_gateway_engine_restarts_total")


SPELLINGS = [FAULT, "/" + FAULT, FAULT + "/", FAULT.upper(), FAULT.replace("/admin", "/%61dmin"),
             FAULT + "?x=1", FAULT.replace("/v2", "/v2/x/..")]  # fmt: skip


def test_the_fault_switch_works_straight_and_is_refused_through_the_sidecar(stack: Stack) -> None:
    status, body = send(stack.gateway_url, "POST", FAULT, {"fault": "resume"}, AUTH)
    assert status == 200, body  # the route is there, for the operator inside the pod
    for target in SPELLINGS:
        status, body = send(stack.proxy_url, "POST", target, {"fault": "kill"}, AUTH)
        assert status == 403, (target, status, body[:300])
        error = json.loads(body)["error"]
        assert error["code"] == 403 and "rule hangup-admin" in error["message"], error
    assert restarts(stack) == 0  # no engine was killed
    assert metric_sum(stack.admin_url, "hangup_proxy_admin_refusals_total") >= len(SPELLINGS)


def test_the_cancel_api_the_call_list_metrics_and_health_pass(stack: Stack) -> None:
    base = stack.proxy_url
    status, body = send(base, "GET", "/v2/requests", headers=AUTH)
    assert status == 200 and "requests" in json.loads(body)
    status, _ = send(base, "POST", "/v2/requests/never-seen/cancel", {}, AUTH)
    assert status == 404  # relayed to the gateway, which never saw it
    assert send(base, "GET", "/metrics")[0] == 200
    assert send(base, "GET", "/v2/health/ready")[0] == 200
    status, body = send(base, "POST", "/v1/completions",
                        {"model": MODEL, "prompt": "hi", "max_tokens": 2})  # fmt: skip
    assert status == 200, body[:300]
    assert send(base, "POST", "/v2/repository/index", {})[0] == 200  # the gateway's listing
