"""Jobs on the sidecar (issue 66, ``proxy/http/job_api.py``): a group of held calls ended by one
call, a batch of ids each answered, vLLM PR 55521's paths answered by the sidecar itself, a
cancel by the answer's own id, and the list of what is held; in front of a server with no cancel
API, and in front of hangup's gateway (what the sidecar does not hold is asked of it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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

NONE, VLLM = AdapterName.NONE, AdapterName.VLLM
TOKEN = "sidecar-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def call(
    session: aiohttp.ClientSession, proxy: Server, method: str, path: str,
    body: object = None, headers: dict[str, str] = AUTH,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    async with session.request(method, http_url(proxy) + path, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


@contextlib.asynccontextmanager
async def held(
    proxy: Server, path: str = "/hold", **fields: str
) -> AsyncIterator[asyncio.StreamReader]:
    """A call the scripted upstream holds, with these header fields."""
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in fields.items())
    reader, writer = await raw_request(
        proxy.addresses["http"],
        f"POST {path} HTTP/1.1\r\nHost: m\r\n{head}Content-Length: 2\r\n\r\n{{}}".encode(),
    )
    try:
        yield reader
    finally:
        writer.close()


async def status_of(reader: asyncio.StreamReader) -> bytes:
    return (await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).split(b" ")[1]


async def test_a_group_cancel_ends_every_call_of_the_group_and_refuses_its_late_ones(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with (
        running_proxy(upstream.url, cancel_adapter=NONE, cancel_token=TOKEN) as proxy,
        held(proxy, X_Hangup_Group="job-1", X_Request_Id="mine-1") as one,
        held(proxy, X_Hangup_Group="job-1") as two,
        held(proxy, X_Hangup_Group="job-2") as other,
    ):
        await wait_until(lambda: proxy.state.inflight == 3, 5, "three calls held")
        status, listed = await call(session, proxy, "GET", "/v2/sidecar/requests?group=job-1")
        assert status == 200 and not listed["truncated"]
        assert sorted(c["group"] for c in listed["requests"]) == ["job-1", "job-1"]
        assert {c["client_request_id"] for c in listed["requests"]} == {"mine-1", None}
        assert (await call(session, proxy, "POST", "/v2/groups/job-1/cancel", headers={}))[0] == 401
        status, answer = await call(session, proxy, "POST", "/v2/groups/job-1/cancel")
        assert status == 200, answer
        assert answer["group"] == "job-1" and len(answer["cancelled_request_ids"]) == 2
        assert {e.get("client_request_id") for e in answer["results"]} == {"mine-1", None}
        assert await status_of(one) == await status_of(two) == b"499"
        assert proxy.state.inflight == 1  # the other job's call goes on
        async with session.post(
            http_url(proxy) + "/echo", json={}, headers={"X-Hangup-Group": "job-1"}
        ) as late:
            assert late.status == 499  # a call of the job still on its way
        assert metric(proxy, "hangup_proxy_cancel_api_calls_total", kind="group") == 1
        assert metric(
            proxy, "hangup_proxy_cancel_api_ids_total", kind="group", state="cancelled"
        ) == 2  # fmt: skip
        await wait_until(
            lambda: metric(proxy, "hangup_proxy_held_ids", kind="group_tombstone") == 1, 3,
            "the buried group counted",
        )  # fmt: skip
        del other


async def test_a_batch_answers_each_id_and_buries_what_nobody_holds(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with (
        running_proxy(
            upstream.url, cancel_adapter=NONE, cancel_token=TOKEN, trust_client_request_id=True,
            max_batch_ids=3,
        ) as proxy,
        held(proxy, X_Request_Id="live-1") as live,
    ):  # fmt: skip
        await upstream.held.wait()
        async with session.post(
            http_url(proxy) + "/echo", json={}, headers={"X-Request-Id": "done-1"}
        ) as done:
            assert done.status == 200
        body = {"request_ids": ["live-1", "done-1", "early-1"]}
        status, answer = await call(session, proxy, "POST", "/v2/requests/cancel", body)
        assert status == 200, answer
        assert [(e["request_id"], e["state"]) for e in answer["results"]] == [
            ("live-1", "cancelled"), ("done-1", "finished"), ("early-1", "not_found")
        ]  # fmt: skip
        assert await status_of(live) == b"499"
        async with session.post(
            http_url(proxy) + "/echo", json={}, headers={"X-Request-Id": "early-1"}
        ) as late:
            assert late.status == 499  # the batch's cancel beat its call
        four = {"request_ids": ["a", "b", "c", "d"]}
        status, refused = await call(session, proxy, "POST", "/v1/requests/cancel", four)
        assert status == 400 and "at most 3" in refused["error"]["message"]


async def test_the_paths_of_vllm_pr_55521_are_the_sidecars_own(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    async with (
        running_proxy(upstream.url, cancel_adapter=VLLM, cancel_token=TOKEN) as proxy,
        held(proxy, X_Request_Id="p-1") as one,
    ):
        await upstream.held.wait()
        assert (await call(session, proxy, "POST", "/v1/requests/p-1/cancel", headers={}))[0] == 401
        status, answer = await call(session, proxy, "POST", "/v1/requests/p-1/cancel")
        assert (status, answer) == (200, {"status": "cancelled", "request_id": "p-1",
                                          "state": "cancelled"})  # fmt: skip
        assert await status_of(one) == b"499"
        status, answer = await call(session, proxy, "DELETE", "/v1/requests/p-1")
        assert status == 404 and answer["error"]["code"] == 404  # ended: the PR's 404
        status, answer = await call(session, proxy, "POST", "/v1/requests/cancel",
                                    {"request_ids": ["p-1"]})  # fmt: skip
        assert status == 200 and answer["results"] == [{"request_id": "p-1", "state": "finished"}]
    assert all("/v1/requests" not in str(r["path"]) for r in upstream.requests)
    async with running_proxy(upstream.url, cancel_adapter=VLLM) as open_proxy:
        status, answer = await call(session, open_proxy, "DELETE", "/v1/requests/x")
        assert status == 403 and "rule vllm-cancel" in answer["error"]["message"]  # no token


async def test_a_cancel_by_the_answers_own_id_ends_the_stream(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession
) -> None:
    """The client set no ``X-Request-Id``: it knows its call by its first event's ``id``."""
    async with (
        running_proxy(upstream.url, cancel_adapter=NONE, cancel_token=TOKEN) as proxy,
        session.post(http_url(proxy) + "/answer", json={}) as resp,
    ):
        first = json.loads((await resp.content.readline()).decode()[6:])
        answer_id = first["id"]
        status, listed = await call(session, proxy, "GET", "/v2/sidecar/requests")
        (entry,) = listed["requests"]
        assert (entry["answer_id"], entry["model"], entry["streaming"]) == (
            answer_id, "scripted", True
        )  # fmt: skip
        status, answer = await call(session, proxy, "POST", f"/v2/requests/{answer_id}/cancel")
        assert (status, answer["state"]) == (200, "cancelled")
        await asyncio.wait_for(upstream.closed.wait(), 5)
        assert await call(session, proxy, "POST", f"/v1/requests/{answer_id}/cancel") == (
            404, {"error": {"message": f"request {answer_id!r} is not in flight: it has ended",
                            "type": "proxy_error", "code": 404}}
        )  # fmt: skip


async def test_in_front_of_the_gateway_what_the_sidecar_does_not_hold_is_asked_of_it(
    session: aiohttp.ClientSession,
) -> None:
    """A call tagged by its body's ``metadata.hangup_group`` (which only the gateway reads) is
    found by the sidecar's group cancel all the same, and a batch's ids the sidecar does not
    hold by their gateway ids; the entries come back with the gateway's phases."""
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, cancel_token=TOKEN) as proxy,
    ):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": LONG, "stream": True,
                "metadata": {"hangup_group": "job-9"}}  # fmt: skip
        async with session.post(http_url(proxy) + "/v1/completions", json=body) as resp:
            await resp.content.readline()
            status, answer = await call(session, proxy, "POST", "/v2/groups/job-9/cancel")
            assert status == 200, answer
            (entry,) = answer["results"]
            assert entry["request_id"] == resp.headers["X-Request-Id"]
            assert (entry["state"], entry["phase"]) == ("cancelled", "decode")
            rest = await asyncio.wait_for(resp.content.read(), 5)
        assert b"request cancelled (explicit)" in rest
        status, answer = await call(session, proxy, "POST", "/v2/requests/cancel",
                                    {"request_ids": [entry["request_id"], "never"]})  # fmt: skip
        assert [(e["request_id"], e["state"]) for e in answer["results"]] == [
            (entry["request_id"], "finished"), ("never", "not_found")
        ]  # fmt: skip


async def test_a_grpc_stream_joins_its_group_by_metadata(session: aiohttp.ClientSession) -> None:
    """gRPC calls are held by their ``x-hangup-group`` too: a group cancel ends a Triton
    client's ``ModelStreamInfer`` ``CANCELLED``; a group that breaks the id rule is
    ``INVALID_ARGUMENT``."""
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, cancel_token=TOKEN,
                      upstream_grpc=gateway.server.listeners["grpc"]) as proxy,
        grpc.aio.insecure_channel(proxy.addresses["grpc"]) as channel,
    ):  # fmt: skip
        streams = channel.stream_stream(INFERENCE + "ModelStreamInfer")
        stream = streams(
            iter([infer_request("hi", max_tokens=LONG).SerializeToString()]),
            metadata=(("x-hangup-group", "g-rpc"),),
        )
        await stream.read()  # the first response: generating
        status, answer = await call(session, proxy, "POST", "/v2/groups/g-rpc/cancel")
        assert status == 200 and len(answer["cancelled_request_ids"]) == 1, answer
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await stream.read() is not grpc.aio.EOF:
                pass
        assert ended.value.code() is grpc.StatusCode.CANCELLED
        # Refused on its metadata, so it sends no message: a grpcio asyncio client's write that
        # meets the refusal reports INTERNAL instead of the status received (grpc/grpc#36066).
        bad = streams(metadata=(("x-hangup-group", "a b"),))
        assert await asyncio.wait_for(bad.code(), 10) is grpc.StatusCode.INVALID_ARGUMENT


@contextlib.asynccontextmanager
async def two_workers(upstream: ScriptedUpstream, run_dir: Path) -> AsyncIterator[list[Server]]:
    """Two workers of one proxy, as ``--workers 2`` runs them (each on a port of its own here,
    so a test picks which one a call or a cancel lands on)."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(running_proxy(
                upstream.url, WorkerOf(run_dir, slot, 2), cancel_adapter=NONE,
                cancel_token=TOKEN,
            ))
            for slot in range(2)
        ]  # fmt: skip


async def test_with_workers_the_group_the_list_and_the_batch_reach_every_worker(
    upstream: ScriptedUpstream, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with (
        two_workers(upstream, tmp_path) as (first, second),
        held(first, X_Hangup_Group="job-w") as one,
        held(second, X_Hangup_Group="job-w") as two,
        held(first, X_Request_Id="solo-1") as solo,
    ):
        await wait_until(lambda: first.state.inflight == 2 and second.state.inflight == 1, 5)
        status, listed = await call(session, second, "GET", "/v2/sidecar/requests")
        assert status == 200 and len(listed["requests"]) == 3, listed
        status, listed = await call(session, second, "GET", "/v2/sidecar/requests?group=job-w")
        assert len(listed["requests"]) == 2
        status, answer = await call(session, second, "POST", "/v2/groups/job-w/cancel")
        assert status == 200 and len(answer["cancelled_request_ids"]) == 2, answer
        assert await status_of(one) == await status_of(two) == b"499"
        for worker in (first, second):  # the job is refused at whichever worker it reaches
            async with session.post(
                http_url(worker) + "/echo", json={}, headers={"X-Hangup-Group": "job-w"}
            ) as late:
                assert late.status == 499
        body = {"request_ids": ["solo-1", "gone-1"]}
        status, answer = await call(session, second, "POST", "/v2/requests/cancel", body)
        assert [(e["request_id"], e["state"]) for e in answer["results"]] == [
            ("solo-1", "cancelled"), ("gone-1", "not_found")
        ]  # fmt: skip
        assert await status_of(solo) == b"499"
        assert first.state.held.buried("gone-1") and second.state.held.buried("gone-1")
