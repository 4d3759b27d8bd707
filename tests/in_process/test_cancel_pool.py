"""A cancel that finds its pod (``--cancel-pool``): an edge proxy in front of a front door that
holds a call without passing the hang-up on, and three gateway pods behind it.

The front door is scripted (``holding_front``): it forwards a call to the pod it picks, with the
edge's ``X-Request-Id``, and reads the whole answer whatever its client does, as an application
server or LiteLLM without ``cancel_on_disconnect`` does for a call that does not stream. The edge
sees its client leave; with ``--cancel-pool`` naming the three pods, its cancel reaches the pod
that holds the call, counted once; without it the pod generates for nobody."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from bench.base.addresses import port_of
from bench.base.waiting import wait_until
from gateway_server.engine.sim.config import SimConfig
from hangup_contract.cancel_labels import Reason
from proxy.cancel.pool import PoolCancelAdapter, resolve
from proxy.labels import CallProtocol, CancelResult
from tests.support.gateway import LONG, MODEL, Gateway, running_gateway
from tests.support.proxy_harness import http_url, metric, running_proxy, wait_metric

SIM = SimConfig(step_base_s=0.005)


@contextlib.asynccontextmanager
async def holding_front(pods: list[Gateway] | list[str], pick: int) -> AsyncIterator[str]:
    """A scripted front door: every call goes to ``pods[pick]`` (a gateway, or a base URL) and
    is read to its end, the client gone or not (aiohttp does not cancel a handler whose client
    left, by default)."""
    target = pods[pick]
    base = target if isinstance(target, str) else target.url

    async def forward(request: web.Request) -> web.Response:
        headers = {"X-Request-Id": request.headers["X-Request-Id"]}
        url = base + request.path
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=await request.read(), headers=headers) as answer,
        ):
            return web.Response(status=answer.status, body=await answer.read())

    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def three_pods() -> AsyncIterator[list[Gateway]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(running_gateway(sim=SIM)) for _ in range(3)]


async def hang_up_chat(url: str, after_s: float) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG}
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(after_s), session.post(url, json=body) as answer:
                await answer.read()


def held(pods: list[Gateway]) -> list[float]:
    return [
        sum(pod.cancellations("client_disconnect", p) for p in ("queued", "prefill", "decode"))
        for pod in pods
    ]


async def test_a_hang_up_at_the_edge_cancels_the_call_on_the_pod_that_holds_it() -> None:
    async with three_pods() as pods, holding_front(pods, pick=1) as front:
        urls = tuple(pod.url for pod in pods)
        async with running_proxy(front, cancel_pool=urls) as edge:
            await hang_up_chat(f"{http_url(edge)}/v1/chat/completions", 0.3)
            await wait_metric(edge, "hangup_proxy_cancel_calls_total", 1, adapter="hangup",
                              result="ok")  # fmt: skip
            assert held(pods) == [0, 1, 0]
            for pod in pods:
                assert await wait_until(lambda p=pod: _idle(p), 5, "nothing in flight")
            assert metric(edge, "hangup_proxy_cancel_calls_total", adapter="hangup",
                          result="not_found") == 0  # fmt: skip
            assert metric(edge, "hangup_proxy_cancel_pool_members_count") == 1
            assert metric(edge, "hangup_proxy_cancel_pool_members_sum") == 3


async def test_the_pool_may_be_the_pods_sidecars() -> None:
    """As the chart deploys a pod: the gateway on loopback, its sidecar on the pod's port
    (trusting the id the front door forwards). The edge's cancel call to each sidecar is relayed
    to its gateway; the pod that holds the call cancels it."""
    async with contextlib.AsyncExitStack() as stack:
        pods = await stack.enter_async_context(three_pods())
        sidecars = [
            http_url(await stack.enter_async_context(
                running_proxy(pod.url, trust_client_request_id=True)))
            for pod in pods
        ]  # fmt: skip
        front = await stack.enter_async_context(holding_front(sidecars, pick=2))
        edge = await stack.enter_async_context(running_proxy(front, cancel_pool=tuple(sidecars)))
        await hang_up_chat(f"{http_url(edge)}/v1/chat/completions", 0.3)
        await wait_metric(edge, "hangup_proxy_cancel_calls_total", 1, adapter="hangup",
                          result="ok")  # fmt: skip
        assert held(pods) == [0, 0, 1]


async def test_without_the_pool_the_pod_generates_for_nobody() -> None:
    """The baseline: the edge's cancel goes to its upstream, the front door, which has no cancel
    API; the pod runs the call on."""
    async with (
        three_pods() as pods,
        holding_front(pods, pick=2) as front,
        running_proxy(front) as edge,
    ):
        await hang_up_chat(f"{http_url(edge)}/v1/chat/completions", 0.3)
        await wait_metric(edge, "hangup_proxy_cancel_calls_total", 1, adapter="hangup",
                          result="not_found")  # fmt: skip
        assert held(pods) == [0, 0, 0]
        assert len(await pods[2].in_flight()) == 1


async def test_a_member_that_cannot_be_asked_does_not_stop_the_one_that_holds_it() -> None:
    async with three_pods() as pods, holding_front(pods, pick=0) as front:
        urls = (f"http://127.0.0.1:{_closed_port()}", *(pod.url for pod in pods))
        async with running_proxy(front, cancel_pool=urls, cancel_attempt_timeout=1.0) as edge:
            await hang_up_chat(f"{http_url(edge)}/v1/chat/completions", 0.3)
            await wait_metric(edge, "hangup_proxy_cancel_calls_total", 1, adapter="hangup",
                              result="ok")  # fmt: skip
            assert held(pods) == [1, 0, 0]
            assert metric(edge, "hangup_proxy_cancel_pool_members_sum") == 4


async def test_an_id_no_member_holds_is_not_found() -> None:
    """A call that ended before its cancel, or never reached a pod: every member answers
    not_found (and keeps a tombstone for the id, which expires as usual)."""
    async with (
        three_pods() as pods,
        holding_front(pods, pick=0) as front,
        running_proxy(front, cancel_pool=tuple(p.url for p in pods)) as edge,
    ):
        assert edge.state is not None
        adapter = edge.state.canceller.adapters[CallProtocol.HTTP]
        for i in range(3):
            result = await adapter.cancel(f"nowhere-{i}", Reason.CLIENT_DISCONNECT)
            assert result is CancelResult.NOT_FOUND


async def test_cancels_that_arrive_together_on_a_fresh_pool_both_find_their_pod() -> None:
    """The first cancel resolves the pool's name; one arriving meanwhile waits for that, rather
    than finding no member (it used to: a failed attempt, retried after a backoff)."""
    async with running_gateway(sim=SIM) as pod:
        streams = []
        for rid in ("first", "second"):
            body = {"model": MODEL, "prompt": "x", "max_tokens": LONG, "stream": True}
            url = f"{pod.url}/v1/completions"
            streams.append(await pod.session.post(url, json=body, headers={"X-Request-Id": rid}))
            await streams[-1].content.readline()  # decoding
        port = port_of(pod.url)
        pool = PoolCancelAdapter([f"http://localhost:{port}"], None, 2.0, refresh=5.0,
                                 max_members=8)  # fmt: skip
        try:
            results = await asyncio.gather(
                pool.cancel("first", Reason.CLIENT_DISCONNECT),
                pool.cancel("second", Reason.CLIENT_DISCONNECT),
            )
        finally:
            await pool.close()
            for stream in streams:
                stream.close()
        assert results == [CancelResult.OK, CancelResult.OK]


async def test_a_pool_name_is_every_address_it_resolves_to() -> None:
    found = await resolve("http://localhost:8000/prefix")
    assert "http://127.0.0.1:8000/prefix" in found and len(found) == len(set(found))
    assert await resolve("http://10.1.2.3:80") == ["http://10.1.2.3:80"]


async def _idle(pod: Gateway) -> bool:
    return not await pod.in_flight()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
