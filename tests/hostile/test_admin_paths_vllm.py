"""vLLM's admin and dev-only routes through the sidecar (``--cancel-adapter vllm
--vllm-abort-endpoint``), against the real ``vllm serve`` in dev mode (``VLLM_SERVER_DEV_MODE=1``,
which that flag needs, and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``) on the tiny local model.

Without the refusal any client that reaches the pod aborts every call in flight with one
``POST /abort_requests {}``, pauses the engine, puts it to sleep, runs ``collective_rpc`` on its
workers or loads a LoRA adapter. Each case shows first that the route is really there (straight to
vLLM: the abort ends a stream, each route answers other than 404, a GET on a POST route 405
without doing anything), then that the sidecar refuses it (403 in OpenAI's error shape, naming
the rule) in every spelling vLLM routes; an operator's ``--allow-admin-path`` opens a route;
metrics, health and completions pass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.base.processes import Process, spawn
from bench.base.scrape import metric_sum
from bench.harness.vllm_stack import ENGINE_ARGS, IGNORE_EOS, MODEL, vllm_serve
from tests.support.exact_target import send
from tests.support.vllm_fixtures import requires_vllm, tiny_model  # noqa: F401 (fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_vllm]

TOKEN = "sidecar-token"
OPENED = ["/reset_prefix_cache", "/is_sleeping"]


@pytest.fixture(scope="module")
def vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    """``vllm serve`` in dev mode, with runtime LoRA loading on: its base URL."""
    tmp = tmp_path_factory.mktemp("vllm-admin")
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    with vllm_serve(tiny_model, tmp, ENGINE_ARGS, dev_mode=True, env=env) as url:
        yield url


def _sidecar(vllm: str, tmp: Path, *extra: str) -> Iterator[Process]:
    token = tmp / "cancel-token"
    token.write_text(TOKEN)
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", vllm, "--cancel-adapter", "vllm", "--vllm-abort-endpoint",
            "--cancel-token-file", str(token), *extra]  # fmt: skip
    with spawn("proxy", args, tmp) as proc:
        yield proc
        proc.terminate()


@pytest.fixture(scope="module")
def sidecar(vllm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    yield from _sidecar(vllm, tmp_path_factory.mktemp("sidecar"))


@pytest.fixture(scope="module")
def opened(vllm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    flags = [arg for path in OPENED for arg in ("--allow-admin-path", path)]
    yield from _sidecar(vllm, tmp_path_factory.mktemp("opened"), *flags)


def refused_as_openai(answer: tuple[int, bytes], rule: str) -> None:
    status, body = answer
    assert status == 403, (status, body[:300])
    error = json.loads(body)["error"]
    assert error["code"] == 403 and f"rule {rule}" in error["message"], error


async def stream_tokens(
    session: aiohttp.ClientSession, base: str, max_tokens: int, started: asyncio.Event
) -> tuple[int, str | None]:
    """A completion streamed through ``base``: the tokens it got (its usage, else its chunks)
    and its finish reason (None when the stream ended without one: the request was aborted).
    Tokens, not chunks: vLLM puts every token that is ready in one chunk when its reader falls
    behind, as a loaded machine makes it."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **IGNORE_EOS}  # fmt: skip
    chunks, finish, used = 0, None, None
    async with session.post(base + "/v1/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        async for line in answer.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                used = event["usage"]["completion_tokens"]
            if not event.get("choices"):
                continue
            chunks += 1
            finish = event["choices"][0].get("finish_reason") or finish
            started.set()
    return (chunks if used is None else used), finish


async def attacked(
    base: str, attack: str, target: str, max_tokens: int
) -> tuple[int, str | None, int]:
    """A stream through ``base`` while ``POST {target} {}`` (abort all) goes to ``attack``, once
    the stream has its first token: the stream's tokens and finish reason, the attack's status."""
    started = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        victim = asyncio.ensure_future(stream_tokens(session, base, max_tokens, started))
        await asyncio.wait_for(started.wait(), 60)
        status, _ = await asyncio.to_thread(send, attack, "POST", target, {})
        tokens, finish = await asyncio.wait_for(victim, 120)
    return tokens, finish, status


# Spellings of /abort_requests: vLLM (uvicorn, Starlette) routes the first three to the admin
# handler and redirects the fourth to it; the rest it answers 404, refused as a margin.
SPELLINGS = [
    "/abort_requests", "/%61bort_requests", "/abort_requests?x=1", "/abort_requests/",
    "//abort_requests", "/ABORT_REQUESTS", "/abort_requests;x", "/v1/../abort_requests",
]  # fmt: skip


async def test_one_client_cannot_abort_every_call_in_flight(vllm: str, sidecar: Process) -> None:
    # Straight to vLLM, POST /abort_requests {} aborts every request it runs: a stream of 2000
    # tokens through the sidecar ends without a finish reason.
    tokens, finish, status = await attacked(sidecar.url(), vllm, "/abort_requests", 2000)
    assert status == 200 and finish != "length" and tokens < 2000, (status, tokens, finish)
    routed = {t: (await asyncio.to_thread(send, vllm, "POST", t, {"request_ids": ["none"]}))[0]
              for t in SPELLINGS}  # fmt: skip
    assert routed["/abort_requests"] == routed["/%61bort_requests"] == 200, routed
    assert routed["/abort_requests?x=1"] == 200 and routed["/abort_requests/"] == 307, routed
    # Through the sidecar, in every spelling: 403, and the stream runs to its end.
    for target in SPELLINGS:
        refused_as_openai(await asyncio.to_thread(send, sidecar.url(), "POST", target, {}),
                          "vllm-rl")  # fmt: skip
    tokens, finish, status = await attacked(sidecar.url(), sidecar.url(), "/abort_requests", 300)
    assert (status, tokens, finish) == (403, 300, "length")


# Each route vLLM serves here, with the method it takes; the rule the sidecar names.
ROUTES = [
    ("POST", "/reset_prefix_cache", "vllm-dev-mode"),
    ("POST", "/reset_mm_cache", "vllm-dev-mode"),
    ("POST", "/reset_encoder_cache", "vllm-dev-mode"),
    ("POST", "/collective_rpc", "vllm-dev-mode"),
    ("GET", "/server_info", "vllm-dev-mode"),
    ("POST", "/sleep", "vllm-dev-mode"),
    ("POST", "/wake_up", "vllm-dev-mode"),
    ("GET", "/is_sleeping", "vllm-dev-mode"),
    ("POST", "/release_kv_cache_memory", "vllm-dev-mode"),
    ("POST", "/pause", "vllm-rl"),
    ("POST", "/resume", "vllm-rl"),
    ("GET", "/is_paused", "vllm-rl"),
    ("POST", "/init_weight_transfer_engine", "vllm-rl"),
    ("POST", "/update_weights", "vllm-rl"),
    ("GET", "/weight_info", "vllm-rl"),
    ("GET", "/get_world_size", "vllm-rl"),
    ("POST", "/v1/load_lora_adapter", "vllm-lora"),
    ("POST", "/v1/unload_lora_adapter", "vllm-lora"),
    ("POST", "/scale_elastic_ep", "vllm-elastic-ep"),
    ("POST", "/inference/v1/abort_requests", "vllm-scale-out-abort"),
]


@pytest.mark.parametrize(("method", "route", "rule"), ROUTES)
def test_each_admin_route_is_served_straight_and_refused_through_the_sidecar(
    vllm: str, sidecar: Process, method: str, route: str, rule: str
) -> None:
    # Straight: a GET route answers, a POST route answers GET with 405 (it is there; nothing
    # runs); vLLM answers 404 for a path it does not serve.
    status, body = send(vllm, "GET", route)
    assert status == (200 if method == "GET" else 405), (route, status, body[:200])
    refused_as_openai(send(sidecar.url(), method, route, {} if method == "POST" else None), rule)
    refused_as_openai(send(sidecar.url(), "GET", route), rule)


def test_an_opened_route_is_relayed_and_only_it(vllm: str, opened: Process) -> None:
    status, body = send(opened.url(), "POST", "/reset_prefix_cache", {})
    assert status == 200, body[:300]
    status, body = send(opened.url(), "GET", "/is_sleeping")
    assert (status, json.loads(body)) == (200, {"is_sleeping": False})
    refused_as_openai(send(opened.url(), "GET", "/server_info"), "vllm-dev-mode")
    refused_as_openai(send(opened.url(), "POST", "/abort_requests", {}), "vllm-rl")


def test_metrics_health_and_completions_pass(sidecar: Process) -> None:
    base = sidecar.url()
    status, body = send(base, "GET", "/metrics")
    assert status == 200 and b"vllm:num_requests_running" in body
    for target in ("/health", "/ping", "/version", "/v1/models", "/load"):
        assert send(base, "GET", target)[0] == 200, target
    completion = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, **IGNORE_EOS}
    status, body = send(base, "POST", "/v1/completions", completion)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    admin = sidecar.url("admin")
    assert send(admin, "GET", "/healthz")[0] == 200
    refused_as_openai(send(base, "GET", "/server_info"), "vllm-dev-mode")
    assert metric_sum(admin, "hangup_proxy_admin_refusals_total", rule="vllm-dev-mode") >= 1
