"""The admin routes of the server behind, matched as the server would route a target
(``proxy.calls.admin_paths``, ``proxy.cancel.admin_routes``): every route of every adapter is
refused in every spelling a client can give it, the paths clients use pass, an operator opens a
route or one path, and a hostile target costs linear time.

The spellings the real servers route to the admin handler (checked in
``test_admin_paths_vllm.py`` and ``test_admin_paths_triton.py``): ``/%61bort_requests``,
``/abort%5frequests``, ``/abort_requests?x=1`` (vLLM, Triton the last); a trailing slash is a
redirect to the route (vLLM). The rest are refused as a margin: no server here routes them.
"""

from __future__ import annotations

import pytest

from bench.harness.hostile import Budget, timed
from hangup_contract.runtime.options import ConfigError
from proxy.calls.admin_paths import AdminGuard, forms
from proxy.cancel.admin_routes import BY_ADAPTER, AdminRoutes
from proxy.config import build_config

ADAPTERS = sorted(BY_ADAPTER)


def concrete(pattern: str) -> str:
    """A path under ``pattern``: each ``*`` a segment, ``**`` two."""
    return pattern.replace("/**", "/x/y").replace("*", "some-model")


def spellings(path: str) -> list[str]:
    """``path`` as a client may spell it for a server that routes it the same."""
    head, _, tail = path[1:].partition("/")
    first = head[0]
    encoded = f"/%{ord(first):02x}{head[1:]}" + (f"/{tail}" if tail else "")
    return [
        path,
        "/" + path,  # //route
        path + "/",  # a redirect to the route (Starlette's redirect_slashes)
        path.upper(),
        encoded,  # /%61bort_requests: uvicorn decodes it into the route
        encoded.replace("%", "%25"),  # decoded twice by a hop in between
        path + "?x=1",
        path + ";x",
        path.replace("/", "//"),
        "/v1/.." + path,
        "/." + path,
        path + "%2F",  # /route/ once decoded
        "/%2F" + path[1:],
        path.replace("/", "\\"),  # a backslash read as a slash
    ]


def every_route(routes: AdminRoutes) -> dict[str, set[str]]:
    """A path under each route, and the rules that name the route (two servers share some:
    ``none`` refuses ``/start_profile`` as vLLM's or SGLang's)."""
    rules: dict[str, set[str]] = {}
    for pattern, rule in routes.http:
        rules.setdefault(concrete(pattern), set()).add(rule.name)
    return rules


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_route_of_every_adapter_is_refused_in_every_spelling(adapter: str) -> None:
    guard = AdminGuard(BY_ADAPTER[adapter])
    missed = [
        (spelling, rules)
        for path, rules in every_route(BY_ADAPTER[adapter]).items()
        for spelling in spellings(path)
        if (refusal := guard.http(spelling)) is None or refusal.rule.name not in rules
    ]
    assert not missed, f"relayed: {missed[:10]}"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_grpc_admin_method_is_refused_as_sent(adapter: str) -> None:
    guard = AdminGuard(BY_ADAPTER[adapter])
    for method, rule in BY_ADAPTER[adapter].grpc:
        sent = method.replace("grpcinferenceservice", "GRPCInferenceService")
        sent = sent.rpartition("/")[0] + "/" + sent.rpartition("/")[2].capitalize()
        refusal = guard.grpc(sent)
        assert refusal is not None and refusal.rule == rule, sent


CLIENT_PATHS = [
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/resp_1/cancel",
    "/v1/models", "/v1/embeddings", "/health", "/ping", "/metrics", "/metrics/pool", "/load",
    "/version", "/generate", "/v2/requests", "/v2/requests/abc/cancel", "/v2/health/live",
    "/v2/health/ready", "/v2", "/v2/models/streamer", "/v2/models/streamer/ready",
    "/v2/models/streamer/config", "/v2/models/streamer/stats", "/v2/models/stats",
    "/v2/models/streamer/infer", "/v2/models/streamer/versions/1/infer",
    "/v2/models/streamer/generate", "/v2/models/streamer/generate_stream",
    "/v1/models/model:predict", "/v1/models/model/loaded", "/invocations",
    "/v2/models/repository/infer",  # a model that happens to be named for a route
]  # fmt: skip
CLIENT_METHODS = [
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelStreamInfer",
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ModelMetadata",
    "/inference.GRPCInferenceService/ModelStatistics",
    "/hangup.v1.Cancellation/Cancel",
    "/grpc.health.v1.Health/Check",
]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_paths_clients_use_pass(adapter: str) -> None:
    guard = AdminGuard(BY_ADAPTER[adapter])
    refused = [p for p in CLIENT_PATHS if guard.http(p) is not None]
    refused += [m for m in CLIENT_METHODS if guard.grpc(m) is not None]
    assert refused == []


def test_the_gateway_keeps_its_repository_index_in_front_of_the_gateway() -> None:
    """hangup's gateway lists its models there (read by tritonclient through the sidecar)."""
    guard = AdminGuard(BY_ADAPTER["hangup"])
    assert guard.http("/v2/repository/index") is None
    assert guard.grpc("/inference.GRPCInferenceService/RepositoryIndex") is None
    assert guard.http("/v2/admin/workers/0/fault") is not None


def test_a_model_name_holding_an_escaped_slash_is_matched_as_triton_splits_it() -> None:
    """Triton routes the raw path: ``a%2Fb`` is one segment there, two once decoded."""
    guard = AdminGuard(BY_ADAPTER["triton"])
    refusal = guard.http("/v2/models/a%2Fb/trace/setting")
    assert refusal is not None and refusal.rule.name == "triton-trace"
    assert forms("/v2/models/a%2Fb/trace/setting") == [
        ["v2", "models", "a", "b", "trace", "setting"],
        ["v2", "models", "a/b", "trace", "setting"],
    ]


def test_the_refusal_names_the_rule_the_route_and_the_flag() -> None:
    refusal = AdminGuard(BY_ADAPTER["vllm"]).http("/%61bort_requests")
    assert refusal is not None
    message = refusal.message("/%61bort_requests")
    assert "rule vllm-rl" in message and "route /abort_requests" in message
    assert "--allow-admin-path /abort_requests" in message


def test_a_route_opened_opens_every_path_under_it_and_one_path_only_itself() -> None:
    guard = AdminGuard(
        BY_ADAPTER["triton"],
        ["/v2/repository/models/*/load", "/v2/trace/setting", "/v2/models/simple/trace/setting"],
    )
    assert guard.http("/v2/repository/models/a/load") is None
    assert guard.http("/v2/repository/models/b/load") is None
    assert guard.http("/v2/repository/models/a/unload") is not None
    assert guard.http("/v2/repository/index") is not None
    assert guard.http("//v2/trace/setting/") is None  # opened in any spelling
    assert guard.http("/v2/models/simple/trace/setting") is None
    assert guard.http("/v2/models/other/trace/setting") is not None


def test_a_grpc_method_is_opened_by_its_path() -> None:
    guard = AdminGuard(BY_ADAPTER["triton"], ["/inference.GRPCInferenceService/RepositoryIndex"])
    assert guard.grpc("/inference.GRPCInferenceService/RepositoryIndex") is None
    assert guard.grpc("/inference.GRPCInferenceService/RepositoryModelLoad") is not None
    assert guard.http("/v2/repository/index") is not None


def test_opening_what_is_no_admin_route_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="'/v1/chat/completions' is not an admin route"):
        AdminGuard(BY_ADAPTER["vllm"], ["/v1/chat/completions"])
    with pytest.raises(ConfigError, match="--allow-admin-path: '/abort_requests' is not"):
        build_config(["--allow-admin-path", "/abort_requests"], {})  # hangup's gateway: none


def test_the_flag_repeats_takes_commas_and_reads_its_variable() -> None:
    argv = ["--cancel-adapter", "vllm", "--allow-admin-path", "/sleep",
            "--allow-admin-path", "/wake_up,/is_sleeping"]  # fmt: skip
    assert build_config(argv, {}).allow_admin_paths == ("/sleep", "/wake_up", "/is_sleeping")
    env = {"HANGUP_PROXY_CANCEL_ADAPTER": "vllm", "HANGUP_PROXY_ALLOW_ADMIN_PATH": "/sleep"}
    config = build_config([], env)
    assert config.allow_admin_paths == ("/sleep",)
    assert config.admin_guard().http("/sleep") is None
    assert config.admin_guard().http("/wake_up") is not None
    assert build_config([], {}).allow_admin_paths == ()


def test_what_is_remembered_stays_bounded_and_right() -> None:
    guard = AdminGuard(BY_ADAPTER["vllm"])
    for i in range(5000):
        assert guard.http(f"/v1/x{i}") is None
    assert guard.http("/collective_rpc") is not None  # past the bound: walked, still refused
    assert guard.http("/" + "a" * 1000) is None
    known = guard._known_http  # the bound is the point
    assert len(known) <= 512 and max(map(len, known)) <= 256


HOSTILE = {
    "escapes": "/" + "%2525" * 1600,
    "dots": "/." * 4000,
    "parents": "/a/.." * 1600,
    "params": "/abort_requests" + ";x" * 3000,
    "slashes": "/" * 8000,
    "segments": "/v2" * 2600,
    "mixed": "/%2F.%2e/;%5C" * 600,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("adapter", ["none", "triton"])
def test_a_hostile_target_costs_linear_time(name: str, adapter: str) -> None:
    """Up to the proxy's request-line limit (8 KiB): within the parse budget (20 ms per MiB +
    10 ms of the thread's CPU), and answered."""
    guard = AdminGuard(BY_ADAPTER[adapter])
    target = HOSTILE[name]
    outcome = timed(guard.http, target)
    assert outcome.error is None
    Budget().check(f"{name} for {adapter}", len(target), outcome.spent)
    outcome = timed(guard.grpc, target)
    assert outcome.error is None
    Budget().check(f"{name} as a gRPC method", len(target), outcome.spent)
