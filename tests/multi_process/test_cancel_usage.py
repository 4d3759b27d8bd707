"""What a cancelled call used, through the real processes: the proxy in front of a gateway of
two API processes (simulated engine). A client that hangs up, and a cancel by id on the sidecar:
each call's usage and seconds per phase in the gateway's ``request_end`` line and its metrics
(read from the API processes' shared files), the same usage in what the client still reads, and
what the sidecar relayed in its call line and metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bench.base.scrape import delta, scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.log_records import records
from bench.harness.stack import MODEL, TOKEN, Stack, running_stack

PROMPT = "one two three four"  # four tokens to the simulated engine
GATEWAY = ["--sim-step-base", "0.01", "--workers", "2", "--api-processes", "2"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("usage"), GATEWAY) as running:
        yield running


def lines(text: str, msg: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        r for r in records(text)
        if r["msg"] == msg and all(r.get(k) == v for k, v in fields.items())
    ]  # fmt: skip


async def test_a_hang_up_through_the_sidecar_is_accounted_on_both_sides(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        before_gw = await scrape_async(session, stack.gateway_url)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3000, "stream": True}
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"{stack.proxy_url}/v1/completions", json=body) as resp,
        ):
            call_id = resp.headers["X-Request-Id"]
            for _ in range(10):  # five tokens' events and their blank lines
                await resp.content.readline()
        # the hang-up: the session closed the connection

        def ended() -> list[dict[str, Any]]:
            return lines(stack.gateway.log(), "request_end", call_id=call_id)

        (line,) = await wait_until(ended, 15, "the gateway's request_end line")
        assert (line["reason"], line["phase"]) == ("client_disconnect", "decode")
        assert line["prompt_tokens"] == 4 and line["generated_tokens"] >= 5
        assert line["decode_s"] > 0 and line["prefill_s"] > 0

        async def counted() -> bool:
            after = await scrape_async(session, stack.gateway_url)
            name = "hangup_gateway_cancelled_prompt_tokens_total"
            return delta(after, before_gw, name, reason="client_disconnect") == 4

        await wait_until(counted, 15, "the cancelled prompt tokens in /metrics")
        after_gw = await scrape_async(session, stack.gateway_url)
        output = "hangup_gateway_cancelled_output_tokens_total"
        assert delta(after_gw, before_gw, output, reason="client_disconnect", phase="decode") == (
            line["generated_tokens"])  # fmt: skip
        seconds = "hangup_gateway_cancelled_phase_seconds_total"
        assert delta(after_gw, before_gw, seconds, reason="client_disconnect", phase="decode") > 0

        def relayed() -> list[dict[str, Any]]:
            return lines(stack.proxy.log(), "call", request_id=call_id)

        (call,) = await wait_until(relayed, 15, "the sidecar's call line")
        assert (call["outcome"], call["reason"]) == ("cancelled", "client_disconnect")
        assert call["bytes_out"] > 0 and call["chunks_out"] >= 1 and call["usage"] is None
        proxy = await scrape_async(session, stack.admin_url)
        relayed_bytes = total(proxy, "hangup_proxy_cancelled_bytes_total",
                              protocol="http", reason="client_disconnect")  # fmt: skip
        assert relayed_bytes >= call["bytes_out"]


async def test_a_cancel_by_id_on_the_sidecar_reaches_the_client_with_its_usage(
    stack: Stack,
) -> None:
    """The client still reads its stream: its last events carry what the call used (the usage
    chunk it asked for, then the error event), the same as the gateway's log and the sidecar's
    call line say."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3000, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{stack.proxy_url}/v1/completions", json=body) as resp,
    ):
        call_id = resp.headers["X-Request-Id"]
        await resp.content.readline()
        cancel = f"{stack.proxy_url}/v2/requests/{call_id}/cancel"
        async with client.post(cancel, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            assert c.status == 200, await c.text()
        rest = await asyncio.wait_for(resp.content.read(), 10)
    events = [json.loads(e[6:]) for e in rest.split(b"\n") if e.startswith(b"data: {")]
    usage = events[-1]["usage"]
    assert events[-2] == events[-2] | {"choices": [], "usage": usage} and "error" in events[-1]
    assert usage["prompt_tokens"] == 4

    def ended() -> list[dict[str, Any]]:
        return lines(stack.gateway.log(), "request_end", call_id=call_id)

    (line,) = await wait_until(ended, 15, "the gateway's request_end line")
    assert (line["reason"], line["prompt_tokens"]) == ("explicit", 4)
    assert line["generated_tokens"] == usage["completion_tokens"]

    def relayed() -> list[dict[str, Any]]:
        return lines(stack.proxy.log(), "call", request_id=call_id)

    (call,) = await wait_until(relayed, 15, "the sidecar's call line")
    assert (call["reason"], call["usage"]) == ("explicit", usage)
