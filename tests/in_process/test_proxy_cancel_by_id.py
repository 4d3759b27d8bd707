"""The proxy's own cancel by id (``proxy/http/cancel_api.py``, issue 49): ``POST
/v2/requests/{id}/cancel`` on the sidecar ends a call it holds, whatever server is behind it, the
way its adapter ends a hang-up, its client kept to hear the end; behind the cancel token; a
cancel that beats its call is honoured; counted as an explicit cancel, not a client disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from bench.base.waiting import wait_until
from bench.harness.grpc_fuzz import INFERENCE, infer_request
from gateway_server.engine.sim.config import SimConfig
from proxy.config import AdapterName
from proxy.server import Server, WorkerOf
from tests.support.gateway import LONG, MODEL, running_gateway
from tests.support.proxy_harness import http_url, metric, raw_request, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

NONE = AdapterName.NONE  # a server with no cancel API (vllm serve, Truss)
TOKEN = "sidecar-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def cancel(
    session: aiohttp.ClientSession, proxy: Server, request_id: str, headers: dict[str, str] = AUTH
) -> tuple[int, dict[str, object]]:
    url = f"{http_url(proxy)}/v2/requests/{request_id}/cancel"
    async with session.post(url, headers=headers) as resp:
        return resp.status, await resp.json()


@contextlib.asynccontextmanager
async def held_stream(proxy: Server, request_id: str) -> AsyncIterator[asyncio.StreamReader]:
    """A held call (``/hold`` never answers) with the client's ``X-Request-Id``."""
    reader, writer = await raw_request(
        proxy.addresses["http"],
        f"POST /hold HTTP/1.1\r\nHost: m\r\nX-Request-Id: {request_id}\r\n"
        "Content-Length: 2\r\n\r\n{}".encode(),
    )
    try:
        yield reader
    finally:
        writer.close()


async def test_without_a_token_the_cancel_path_is_relayed_as_before(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url, cancel_adapter=NONE) as proxy:
        status, _ = await cancel(session, proxy, "anything")
    assert status == 200  # the scripted upstream's own cancel route answered
    assert [c.request_id for c in upstream.cancels] == ["anything"]


async def test_a_cancel_by_id_ends_a_held_call_behind_a_server_without_a_cancel_api(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    """``--cancel-adapter none`` (a server with no cancel API: ``vllm serve``, Truss): the
    sidecar closes the upstream call as for a hang-up, and its client gets 499 (nothing had
    been sent), as the gateway answers a call cancelled under it."""
    async with (
        running_proxy(upstream.url, cancel_adapter=NONE, cancel_token=TOKEN) as proxy,
        held_stream(proxy, "job-7") as reader,
    ):
        await upstream.held.wait()
        assert (await cancel(session, proxy, "job-7", {}))[0] == 401
        assert not upstream.closed.is_set()
        assert await cancel(session, proxy, "job-7") == (
            200, {"request_id": "job-7", "state": "cancelled"}
        )  # fmt: skip
        await asyncio.wait_for(upstream.closed.wait(), 5)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = json.loads(await reader.readexactly(length))
        assert head.startswith(b"HTTP/1.1 499 ")
        assert body["error"]["type"] == "cancelled"
        assert await cancel(session, proxy, "job-7") == (
            200, {"request_id": "job-7", "state": "finished"}
        )  # fmt: skip
        assert metric(proxy, "hangup_proxy_cancels_total", protocol="http", reason="explicit") == 1
        assert metric(
            proxy, "hangup_proxy_client_disconnects_total", protocol="http",
            stage="before_response",
        ) == 0  # fmt: skip
        assert upstream.cancels == []  # nothing relayed: the sidecar answered


async def test_a_cancel_that_beats_its_call_refuses_it_on_arrival(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(
        upstream.url, cancel_adapter=NONE, cancel_token=TOKEN, trust_client_request_id=True
    ) as proxy:
        status, body = await cancel(session, proxy, "early-1")
        async with session.post(
            http_url(proxy) + "/echo", json={}, headers={"X-Request-Id": "early-1"}
        ) as resp:
            refused = (resp.status, (await resp.json())["error"]["type"])
        async with session.post(
            http_url(proxy) + "/echo", json={}, headers={"X-Request-Id": "early-1"}
        ) as resp:
            again = resp.status  # the tombstone is spent
    assert status == 404 and "early-1" in str(body)
    assert refused == (499, "cancelled")
    assert again == 200
    assert len(upstream.requests) == 1


async def test_with_the_hangup_adapter_the_gateway_ends_the_call_and_the_client_hears_it(
    session: aiohttp.ClientSession,
) -> None:
    """In front of hangup's gateway the sidecar's cancel by id is the cancel call a hang-up
    makes, for the id the call went up with (not the one the caller named): the gateway aborts
    the engine request and ends the stream with its error event, which the client reads."""
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, cancel_token=TOKEN) as proxy,
    ):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": LONG, "stream": True}
        async with session.post(
            http_url(proxy) + "/v1/completions", json=body, headers={"X-Request-Id": "job-9"}
        ) as resp:
            assert resp.status == 200
            await resp.content.readline()  # the stream has begun
            upstream_id = resp.headers["X-Request-Id"]
            assert upstream_id != "job-9"
            assert await cancel(session, proxy, "job-9") == (
                200, {"request_id": "job-9", "state": "cancelled"}
            )  # fmt: skip
            rest = await asyncio.wait_for(resp.content.read(), 5)
        assert b"request cancelled (explicit)" in rest and b"[DONE]" not in rest
        await wait_until(lambda: gateway.cancellations("explicit", "decode") == 1, 5, "cancel")
        assert not await gateway.in_flight()
        assert metric(proxy, "hangup_proxy_cancels_total", protocol="http", reason="explicit") == 1


async def test_with_the_hangup_adapter_an_id_not_held_is_asked_of_the_gateway(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(upstream.url, cancel_token=TOKEN) as proxy:
        status, _ = await cancel(session, proxy, "elsewhere")
    assert status == 200
    assert [c.request_id for c in upstream.cancels] == ["elsewhere"]


@pytest.mark.parametrize("body", [b"[]", b'{"reason": 7}', b"not json"])
async def test_a_cancel_body_that_is_not_the_contracts_is_refused(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, body: bytes
) -> None:
    async with running_proxy(upstream.url, cancel_adapter=NONE, cancel_token=TOKEN) as proxy:
        url = f"{http_url(proxy)}/v2/requests/x/cancel"
        async with session.post(url, data=body, headers=AUTH) as resp:
            assert resp.status == 400


@contextlib.asynccontextmanager
async def two_workers(upstream: ScriptedUpstream, run_dir: Path) -> AsyncIterator[list[Server]]:
    """Two workers of one proxy, as ``--workers 2`` runs them (here each on a port of its own,
    so a test picks which one a call or a cancel lands on)."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(running_proxy(
                upstream.url, WorkerOf(run_dir, slot, 2), cancel_adapter=NONE,
                cancel_token=TOKEN,
            ))
            for slot in range(2)
        ]  # fmt: skip


async def test_with_workers_a_cancel_reaches_the_worker_that_holds_the_call(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with two_workers(upstream, tmp_path) as (holder, asked), held_stream(holder, "w-1"):
        await upstream.held.wait()
        assert await cancel(session, asked, "w-1") == (
            200, {"request_id": "w-1", "state": "cancelled"}
        )  # fmt: skip
        await asyncio.wait_for(upstream.closed.wait(), 5)
        assert await cancel(session, asked, "w-1") == (
            200, {"request_id": "w-1", "state": "finished"}
        )  # fmt: skip
    assert metric(holder, "hangup_proxy_cancels_total", protocol="http", reason="explicit") == 1


async def test_with_workers_a_cancel_that_beats_its_call_is_honoured_wherever_it_arrives(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The tombstone is left in every worker; the call spends it in the one it lands on, and
    the others forget theirs (a later call under the id is served)."""
    async with two_workers(upstream, tmp_path) as (one, other):
        assert (await cancel(session, one, "early-2"))[0] == 404
        headers = {"X-Request-Id": "early-2"}
        async with session.post(http_url(other) + "/echo", json={}, headers=headers) as resp:
            assert resp.status == 499
        await wait_until(
            lambda: not one.state.held.buried("early-2"), 5, "the tombstone spent"
        )  # fmt: skip
        async with session.post(http_url(one) + "/echo", json={}, headers=headers) as resp:
            assert resp.status == 200


async def test_a_grpc_stream_is_held_and_ended_by_a_cancel_by_id_too(
    session: aiohttp.ClientSession,
) -> None:
    """A Triton client's ``ModelStreamInfer`` through the proxy's gRPC port, named by its
    ``x-request-id``: the cancel by id on the HTTP port ends it as the proxy's own stops do
    (the gateway's gRPC cancel for the id it went up with, then ``CANCELLED`` to the client)."""
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, cancel_token=TOKEN,
                      upstream_grpc=gateway.server.listeners["grpc"]) as proxy,
        grpc.aio.insecure_channel(proxy.addresses["grpc"]) as channel,
    ):  # fmt: skip
        stream = channel.stream_stream(INFERENCE + "ModelStreamInfer")(
            iter([infer_request("hi", max_tokens=LONG).SerializeToString()]),
            metadata=(("x-request-id", "g-1"),),
        )
        await stream.read()  # the first response: generating
        assert await cancel(session, proxy, "g-1") == (
            200, {"request_id": "g-1", "state": "cancelled"}
        )  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await stream.read() is not grpc.aio.EOF:
                pass
        assert ended.value.code() is grpc.StatusCode.CANCELLED
        await wait_until(lambda: gateway.cancellations("explicit", "decode") == 1, 5, "cancel")
        assert not await gateway.in_flight()
        assert metric(proxy, "hangup_proxy_cancels_total", protocol="grpc", reason="explicit") == 1
