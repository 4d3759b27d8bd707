"""What the sidecar knows of a call that ended cancelled, in its call log line and its metrics:
the bytes and pieces (chunks) it relayed to the client, and the server's own usage where it
sent one (a ``vllm serve`` stream's ``continuous_usage_stats`` chunk, hangup's gateway's end of
a cancelled stream, its gRPC trailing metadata ``hangup-usage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aiohttp
import grpc
import pytest

from bench.base.waiting import wait_until
from bench.harness.grpc_fuzz import INFERENCE, infer_request
from gateway_server.engine.sim.config import SimConfig
from proxy.calls.lifecycle import CALL_LOGGER
from proxy.config import AdapterName
from tests.support.gateway import LONG, MODEL, running_gateway
from tests.support.proxy_harness import http_url, metric, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

TOKEN = "sidecar-token"


def call_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == CALL_LOGGER]  # type: ignore[attr-defined]


def cancelled_metric(
    proxy: Any, what: str, reason: str, protocol: str = "http", **more: str
) -> float:
    name = f"hangup_proxy_cancelled_{what}_total"
    return metric(proxy, name, protocol=protocol, reason=reason, **more)


async def test_a_hang_up_logs_and_counts_what_was_relayed_and_the_servers_own_usage(
    upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """In front of a server whose chunks carry usage (``vllm serve`` with
    ``continuous_usage_stats``): the last one relayed is what the call had used."""
    caplog.set_level(logging.INFO, logger=CALL_LOGGER)
    async with running_proxy(upstream.url, cancel_adapter=AdapterName.NONE) as proxy:
        received = b""
        async with aiohttp.ClientSession() as client:
            url = f"{http_url(proxy)}/sse?events=100&gate=1&usage=1"
            async with client.get(url) as resp:
                for event in range(1, 4):  # one at a time: each its own upstream read
                    await upstream.release(1)
                    while received.count(b"\n\n") < event:
                        received += await resp.content.readany()
        await wait_until(lambda: call_lines(caplog), what="the call's line")
        (line,) = call_lines(caplog)
        assert (line["outcome"], line["reason"]) == ("cancelled", "client_disconnect")
        assert line["chunks_out"] == 3 and line["bytes_out"] == len(received)
        assert line["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        reason = "client_disconnect"
        assert cancelled_metric(proxy, "bytes", reason) == len(received)
        assert cancelled_metric(proxy, "chunks", reason) == 3
        assert cancelled_metric(proxy, "usage_tokens", reason, kind="prompt") == 7
        assert cancelled_metric(proxy, "usage_tokens", reason, kind="completion") == 3
        await upstream.release(100)


async def test_a_call_that_completes_or_sent_no_usage_says_none(
    upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Usage is read only at the end of a call that ended cancelled, and only if the server
    sent one: a completed call's answer is not parsed, and nothing is made up."""
    caplog.set_level(logging.INFO, logger=CALL_LOGGER)
    async with running_proxy(upstream.url, cancel_adapter=AdapterName.NONE) as proxy:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{http_url(proxy)}/sse?events=2&usage=1") as resp:
                assert (await resp.read()).count(b"\n\n") == 3
            async with client.get(f"{http_url(proxy)}/sse?events=100&gate=1") as resp:
                seen = b""
                for event in range(1, 3):
                    await upstream.release(1)
                    while seen.count(b"\n\n") < event:
                        seen += await resp.content.readany()
        await wait_until(lambda: len(call_lines(caplog)) == 2, what="both lines")
        completed, cancelled = call_lines(caplog)
        assert (completed["outcome"], completed["usage"]) == ("completed", None)
        assert 1 <= completed["chunks_out"] <= 3  # three events, coalesced or not
        assert (cancelled["outcome"], cancelled["chunks_out"], cancelled["usage"]) == (
            "cancelled", 2, None)  # fmt: skip
        assert cancelled_metric(proxy, "usage_tokens", "client_disconnect", kind="prompt") == 0
        await upstream.release(100)


async def test_in_front_of_the_gateway_a_cancel_by_id_relays_and_logs_the_calls_usage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=CALL_LOGGER)
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, cancel_token=TOKEN) as proxy,
        aiohttp.ClientSession() as client,
    ):
        body = {"model": MODEL, "prompt": "one two three", "max_tokens": LONG, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        url = http_url(proxy)
        async with client.post(f"{url}/v1/completions", json=body,
                               headers={"X-Request-Id": "job-1"}) as resp:  # fmt: skip
            first = await resp.content.readline()
            cancel = f"{url}/v2/requests/job-1/cancel"
            async with client.post(cancel, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                assert c.status == 200
            received = first + await asyncio.wait_for(resp.content.read(), 5)
        events = [json.loads(e[6:]) for e in received.split(b"\n\n") if e.startswith(b"data: {")]
        usage = events[-1]["usage"]
        assert events[-2]["usage"] == usage and usage["prompt_tokens"] == 3
        await wait_until(lambda: call_lines(caplog), what="the call's line")
        (line,) = call_lines(caplog)
        assert (line["outcome"], line["reason"]) == ("cancelled", "explicit")
        assert line["usage"] == usage and 1 <= line["chunks_out"] <= len(events)
        assert cancelled_metric(proxy, "usage_tokens", "explicit", kind="completion") == usage[
            "completion_tokens"]  # fmt: skip


async def test_over_grpc_the_messages_relayed_and_the_gateways_trailing_usage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``ModelStreamInfer`` call the gateway ended ``CANCELLED`` (its cancel API, called
    directly): the sidecar relays the trailing ``hangup-usage`` and logs it with the messages
    it relayed."""
    caplog.set_level(logging.INFO, logger=CALL_LOGGER)
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.005), token=TOKEN) as gateway,
        running_proxy(gateway.url, upstream_grpc=gateway.server.listeners["grpc"]) as proxy,
        grpc.aio.insecure_channel(proxy.addresses["grpc"]) as channel,
    ):
        stream = channel.stream_stream(INFERENCE + "ModelStreamInfer")(
            iter([infer_request("hi there", max_tokens=LONG).SerializeToString()])
        )
        upstream_id = dict(await stream.initial_metadata())["x-request-id"]
        read = 0
        for _ in range(2):
            await stream.read()
            read += 1
        _, answer = await gateway.cancel(upstream_id)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await stream.read() is not grpc.aio.EOF:
                read += 1
        assert ended.value.code() is grpc.StatusCode.CANCELLED
        told = json.loads(dict(ended.value.trailing_metadata() or ())["hangup-usage"])
        assert told == answer["usage"] and told["prompt_tokens"] == 2
        await wait_until(lambda: call_lines(caplog), what="the call's line")
        (line,) = call_lines(caplog)
        assert line["usage"] == told and line["chunks_out"] == read  # its messages
        with contextlib.suppress(Exception):
            stream.cancel()
