"""The Responses API through the real proxy in front of the real gateway (simulated engine), both
as processes: the ``openai`` client's calls work through the proxy, a hang-up on a synchronous
or a streaming response is a ``client_disconnect`` cancellation (the proxy cancels the id it
sent, which the response's id names), and a background response outlives clients that leave
until its cancel, sent through the proxy, stops it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import pytest

from bench.base.scrape import Samples, delta, scrape_async
from bench.base.waiting import wait_until
from bench.harness.stack import (
    MODEL,
    RawClients,
    Stack,
    completion_request,
    in_flight,
    running_stack,
)

LONG = 4000
CANCELS = "hangup_gateway_cancellations_total"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway with 5 ms steps behind a proxy with default settings (its own ids)."""
    with running_stack(tmp_path_factory.mktemp("resp"), ["--sim-step-base", "0.005"]) as s:
        yield s


@pytest.fixture
async def proxied(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=stack.proxy_url + "/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


async def test_responses_through_the_proxy(stack: Stack, proxied: openai.AsyncOpenAI) -> None:
    made = await proxied.responses.create(model=MODEL, input="hello there", max_output_tokens=8)
    stream = await proxied.responses.create(
        model=MODEL, input="hello there", max_output_tokens=8, stream=True
    )
    events = [e async for e in stream]
    assert made.status == "incomplete" and len(made.output_text.split()) == 8
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == made.output_text  # type: ignore[union-attr]
    assert (await proxied.responses.retrieve(made.id)).output_text == made.output_text


async def test_hang_up_on_a_streaming_response(
    stack: Stack, session: aiohttp.ClientSession
) -> None:
    before = await scrape_async(session, stack.gateway_url)
    body = {"model": MODEL, "input": "x", "max_output_tokens": LONG, "stream": True}
    resp = await session.post(f"{stack.proxy_url}/v1/responses", json=body)
    await resp.content.readuntil(b"event: response.output_text.delta\n")
    resp.close()  # the client leaves mid-stream
    await _counted(session, stack, before, "decode")


async def test_hang_up_on_a_synchronous_response(
    stack: Stack, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    before = await scrape_async(session, stack.gateway_url)
    body = {"model": MODEL, "input": "x", "max_output_tokens": LONG}
    _, writer = await raw.open(stack.proxy_url, completion_request("/v1/responses", body))

    async def decoding() -> bool:
        calls = await in_flight(session, stack.gateway_url)
        return any(c["phase"] == "decode" for c in calls.values())

    await wait_until(decoding, what="the response decoding")
    writer.close()  # nothing was answered yet: the proxy must notice the FIN
    await _counted(session, stack, before, "decode")


async def test_background_outlives_its_clients_until_its_cancel(
    stack: Stack, session: aiohttp.ClientSession, proxied: openai.AsyncOpenAI
) -> None:
    before = await scrape_async(session, stack.gateway_url)
    body = {
        "model": MODEL,
        "input": "x",
        "max_output_tokens": LONG,
        "background": True,
        "stream": True,
    }
    posted = await session.post(f"{stack.proxy_url}/v1/responses", json=body)
    created = json.loads((await posted.content.readuntil(b"\n\n")).split(b"data: ")[1])
    response_id = created["response"]["id"]
    await posted.content.readuntil(b"event: response.output_text.delta\n")
    posted.close()  # the client leaves the POST's stream: the proxy cancels the POST's id
    work = response_id.removeprefix("resp_")
    seen = await _tokens(session, stack, work, 0)
    resumed = await session.get(f"{stack.proxy_url}/v1/responses/{response_id}?stream=true")
    await resumed.content.readuntil(b"event: response.output_text.delta\n")
    resumed.close()  # and the GET's: no engine request is under either id
    await _tokens(session, stack, work, seen + 20)  # it went on generating
    cancelled = await proxied.responses.cancel(response_id)  # through the proxy, no token
    assert cancelled.status == "cancelled"
    await wait_until(lambda: _idle(session, stack), what="nothing in flight")
    after = await scrape_async(session, stack.gateway_url)
    assert delta(after, before, CANCELS, reason="explicit", phase="decode") == 1
    assert delta(after, before, CANCELS, reason="client_disconnect") == 0


async def _counted(
    session: aiohttp.ClientSession, stack: Stack, before: Samples, phase: str
) -> None:
    await wait_until(lambda: _idle(session, stack), what="nothing in flight")
    after = await scrape_async(session, stack.gateway_url)
    assert delta(after, before, CANCELS, reason="client_disconnect", phase=phase) == 1
    assert delta(after, before, CANCELS) == 1


async def _idle(session: aiohttp.ClientSession, stack: Stack) -> bool:
    return not await in_flight(session, stack.gateway_url)


async def _tokens(session: aiohttp.ClientSession, stack: Stack, rid: str, above: int) -> int:
    async def more() -> int:
        entry = (await in_flight(session, stack.gateway_url)).get(rid)
        assert entry is not None, f"{rid} is no longer in flight"
        return int(entry["generated_tokens"]) if entry["generated_tokens"] > above else 0

    return await wait_until(more, what=f"{rid} past {above} tokens")
