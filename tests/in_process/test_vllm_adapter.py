"""``--cancel-adapter vllm`` at the adapter level (the real ``vllm serve`` behind the proxy is in
``tests/vllm/test_vllm_serve_adapter.py``): by default a hang-up closes the upstream stream and
makes no call; with ``--vllm-abort-endpoint`` it also asks ``POST /abort_requests`` to abort the
engine request ids vLLM derives from the ``X-Request-Id`` the proxy sent, or for a Responses call
from the ``request_id`` the proxy wrote into its body."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from hangup_contract.cancel_labels import Reason
from proxy.cancel.choice import open_grpc_adapter, open_http_adapter
from proxy.cancel.http import HttpCancelAdapter
from proxy.cancel.servers import VllmAbort
from proxy.config import AdapterName, build_config
from proxy.errors import CancelAttemptFailed
from proxy.labels import CancelResult
from tests.support.proxy_harness import metric, raw_request, running_proxy, wait_metric
from tests.support.scripted_upstream import ScriptedUpstream


class AbortEndpoint:
    """Records ``POST /abort_requests`` calls and answers each with ``status``."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, object], str | None]] = []
        self.status = 200
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _abort(self, request: web.Request) -> web.Response:
        self.calls.append((await request.json(), request.headers.get("Authorization")))
        return web.Response(status=self.status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/abort_requests", self._abort)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture
async def endpoint() -> AsyncIterator[AbortEndpoint]:
    server = AbortEndpoint()
    await server.start()
    yield server
    assert server.runner is not None
    await server.runner.cleanup()


async def test_the_abort_names_the_engine_ids_vllm_gave_the_call(endpoint: AbortEndpoint) -> None:
    adapter = HttpCancelAdapter(VllmAbort(), endpoint.url, "tok", attempt_timeout=5.0)
    try:
        assert await adapter.cancel("abc123", Reason.CLIENT_DISCONNECT) is CancelResult.OK
    finally:
        await adapter.close()
    body, auth = endpoint.calls[0]
    assert body == {"request_ids": ["chatcmpl-abc123", "cmpl-abc123-0", "resp_abc123_0"]}
    assert auth == "Bearer tok"


@pytest.mark.parametrize(
    ("status", "expected"),
    [(404, CancelResult.ERROR), (401, CancelResult.ERROR), (503, None), (429, None)],
)
async def test_what_vllms_answers_mean(
    endpoint: AbortEndpoint, status: int, expected: CancelResult | None
) -> None:
    """404: the server runs without VLLM_SERVER_DEV_MODE (retrying cannot help); 5xx and 429
    are worth another attempt."""
    endpoint.status = status
    adapter = HttpCancelAdapter(VllmAbort(), endpoint.url, None, attempt_timeout=5.0)
    try:
        if expected is None:
            with pytest.raises(CancelAttemptFailed, match=str(status)):
                await adapter.cancel("x", Reason.CLIENT_DISCONNECT)
        else:
            assert await adapter.cancel("x", Reason.CLIENT_DISCONNECT) is expected
    finally:
        await adapter.close()


@pytest.mark.parametrize(
    ("argv", "http_adapter", "calls"),
    [
        (["--cancel-adapter", "vllm"], "vllm", False),
        (["--cancel-adapter", "vllm", "--vllm-abort-endpoint"], "vllm", True),
        (["--cancel-adapter", "sglang"], "sglang", True),
        (["--cancel-adapter", "none"], "none", False),
        ([], "hangup", True),
    ],
)
async def test_each_adapter_name_opens_its_adapters(
    argv: list[str], http_adapter: str, calls: bool
) -> None:
    config = build_config(argv, {})
    http, grpc = open_http_adapter(config), open_grpc_adapter(config)
    try:
        assert (http.name, http.calls_upstream) == (http_adapter, calls)
        hangup = config.cancel_adapter is AdapterName.HANGUP
        assert grpc.calls_upstream is hangup  # only hangup's gateway has a gRPC cancel
    finally:
        await http.close()
        await grpc.close()


async def test_without_the_abort_endpoint_a_hang_up_closes_the_stream_and_calls_nothing(
    upstream: ScriptedUpstream,
) -> None:
    async with running_proxy(upstream.url, cancel_adapter=AdapterName.VLLM) as proxy:
        head = b"POST /hold HTTP/1.1\r\nHost: m\r\nContent-Length: 2\r\n\r\n{}"
        _, writer = await raw_request(proxy.addresses["http"], head)
        await upstream.held.wait()
        writer.close()
        await upstream.closed.wait()  # vLLM aborts the engine request when this happens
        assert not upstream.cancels
        assert metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="cancelled")
        assert not metric(proxy, "hangup_proxy_cancel_calls_total", adapter="vllm", result="ok")


@pytest.mark.parametrize("background", [False, True])
async def test_a_responses_call_is_aborted_by_the_id_the_proxy_wrote_in_its_body(
    upstream: ScriptedUpstream, endpoint: AbortEndpoint, background: bool
) -> None:
    """vLLM's Responses route ignores ``X-Request-Id``: its engine request is
    ``{body's request_id}_0``. The proxy writes ``resp_{call id}`` there (the client's own is
    replaced); a hang-up aborts ``resp_{call id}_0``, unless the response is a background one,
    which is meant to outlive its client."""
    sent = {"model": "m", "input": "Hi", "stream": True, "request_id": "mine"}
    body = json.dumps({**sent, "background": background}).encode()
    head = (
        "POST /v1/responses HTTP/1.1\r\nHost: m\r\nX-Request-Id: call-7\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    async with running_proxy(
        upstream.url,
        cancel_adapter=AdapterName.VLLM,
        vllm_abort_endpoint=True,
        cancel_url=endpoint.url,
        trust_client_request_id=True,
    ) as proxy:
        _, writer = await raw_request(proxy.addresses["http"], head.encode() + body)
        await upstream.held.wait()
        (relayed,) = upstream.held_bodies
        assert json.loads(relayed) == {
            **sent,
            "background": background,
            "request_id": "resp_call-7",
        }
        writer.close()
        await upstream.closed.wait()
        assert proxy.state is not None
        if background:
            assert proxy.state.canceller.pending == 0 and not endpoint.calls
            return
        await wait_metric(proxy, "hangup_proxy_cancel_calls_total", 1, adapter="vllm", result="ok")
    ((abort, _),) = endpoint.calls
    assert abort == {"request_ids": ["chatcmpl-call-7", "cmpl-call-7-0", "resp_call-7_0"]}


async def test_a_chat_body_is_relayed_untouched_beside_the_responses_tagging(
    upstream: ScriptedUpstream, endpoint: AbortEndpoint
) -> None:
    """Only ``POST /v1/responses`` bodies are rewritten: a chat completion's id is its header."""
    body = b'{"model": "m", "messages": [], "request_id": "mine"}'
    async with running_proxy(
        upstream.url,
        cancel_adapter=AdapterName.VLLM,
        vllm_abort_endpoint=True,
        cancel_url=endpoint.url,
    ) as proxy:
        head = f"POST /hold HTTP/1.1\r\nHost: m\r\nContent-Length: {len(body)}\r\n\r\n"
        _, writer = await raw_request(proxy.addresses["http"], head.encode() + body)
        await upstream.held.wait()
        writer.close()
        await upstream.closed.wait()
    assert upstream.held_bodies == [body]
