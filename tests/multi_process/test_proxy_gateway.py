"""The proxy in front of the real gateway (simulated engine), both as real processes.

Hang-ups in each stage and phase: the gateway must record reason ``client_disconnect`` with the
phase the request was in, and generate at most one more engine step of tokens after the hang-up.
Steps last 100 ms here so that "hang up right after a step boundary, then at most one more token"
is a property of the proxy's cancel path, not of luck. The client's ids are trusted
(``--trust-client-request-id``) so tests can find their request in the gateway's call list.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from bench.base.scrape import Samples, delta, scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.stack import (
    MODEL,
    RawClients,
    Stack,
    completion_request,
    in_flight,
    running_stack,
)
from gateway_server.sse import SSEDecoder

SLOW_STEPS = ["--sim-slots", "1", "--sim-step-base", "0.1", "--sim-prefill-chunk", "8"]
LONG_PROMPT = " ".join(["word"] * 400)  # 50 prefill steps of 8 tokens: 5 s in prefill


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    with running_stack(tmp, SLOW_STEPS, ["--trust-client-request-id"]) as running:
        yield running


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway with 5 ms steps and 8 slots behind a proxy with default settings."""
    with running_stack(tmp_path_factory.mktemp("fast"), ["--sim-step-base", "0.005"]) as running:
        yield running


async def test_openai_client_through_the_proxy(fast: Stack) -> None:
    direct = openai.AsyncOpenAI(base_url=fast.gateway_url + "/v1", api_key="unused")
    proxied = openai.AsyncOpenAI(base_url=fast.proxy_url + "/v1", api_key="unused")
    async with direct, proxied:
        want = await direct.completions.create(model=MODEL, prompt="hello there", max_tokens=12)
        got = await proxied.completions.create(model=MODEL, prompt="hello there", max_tokens=12)
        assert got.choices[0].text == want.choices[0].text != ""
        stream = await proxied.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=12,
            stream=True,
        )
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        chat = await direct.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=12
        )
        assert "".join(pieces) == chat.choices[0].message.content
        with pytest.raises(openai.NotFoundError) as via_proxy:
            await proxied.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        with pytest.raises(openai.NotFoundError) as via_direct:
            await direct.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        assert via_proxy.value.body == via_direct.value.body


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl command")
async def test_curl_timing_out_cancels_a_non_streaming_call(fast: Stack) -> None:
    """A non-streaming client that gives up (curl --max-time) is cancelled upstream, not left
    generating until max_tokens."""
    body = json.dumps({"model": MODEL, "prompt": "a long answer", "max_tokens": 3000})
    before = await _scrape_both(fast)
    done = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "0.5", "-H", "Content-Type: application/json",
        "-d", body, fast.proxy_url + "/v1/completions",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await done.communicate()
    assert done.returncode == 28, err  # curl: operation timed out
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: _idle(session, fast), within=10, what="nothing in flight")

        async def counted() -> bool:
            _, px = await _scrape_both(fast, session)
            return delta(px, before[1], "hangup_proxy_cancel_calls_total") > 0

        await wait_until(counted, within=10, what="the cancel call answered")
        gw, px = await _scrape_both(fast, session)
    cancels = "hangup_gateway_cancellations_total"
    assert delta(gw, before[0], cancels, reason="client_disconnect", phase="decode") == 1
    disconnects = "hangup_proxy_client_disconnects_total"
    assert delta(px, before[1], disconnects, stage="before_response") == 1


async def test_kserve_generate_stream_hangup_is_cancelled(
    fast: Stack, session: aiohttp.ClientSession
) -> None:
    before, _ = await _scrape_both(fast, session)
    body = {"text_input": "x", "parameters": {"max_tokens": 3000}}
    decoder = SSEDecoder()
    resp = await session.post(f"{fast.proxy_url}/v2/models/{MODEL}/generate_stream", json=body)
    events = []
    while len(events) < 3:
        events.extend(json.loads(e.data) for e in decoder.feed(await resp.content.readany()))
    assert all(e["model_name"] == MODEL and not e["triton_final_response"] for e in events)
    resp.close()  # hang up mid-stream
    await wait_until(lambda: _idle(session, fast), within=10, what="nothing in flight")
    after, _ = await _scrape_both(fast, session)
    cancels = "hangup_gateway_cancellations_total"
    assert (
        total(after, cancels, reason="client_disconnect")
        - total(before, cancels, reason="client_disconnect")
        == 1
    )


async def _scrape_both(
    stack: Stack, session: aiohttp.ClientSession | None = None
) -> tuple[Samples, Samples]:
    """(gateway samples, proxy samples)."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await _scrape_both(stack, own)
    return await scrape_async(session, stack.gateway_url), await scrape_async(
        session, stack.admin_url
    )


async def _idle(session: aiohttp.ClientSession, stack: Stack) -> bool:
    return not await in_flight(session, stack.gateway_url)


async def _wait_phase(session: aiohttp.ClientSession, stack: Stack, rid: str, phase: str) -> int:
    """Wait until ``rid`` is in ``phase``; for decode, until a step boundary just passed.

    Returns the tokens generated so far.
    """
    seen: dict[str, int] = {}

    async def reached() -> bool:
        entry = (await in_flight(session, stack.gateway_url)).get(rid)
        if entry is None or entry["phase"] != phase:
            return False
        tokens = int(entry["generated_tokens"])
        if phase != "decode":
            seen["tokens"] = tokens
            return True
        if "first" not in seen:
            seen["first"] = tokens
            return False
        seen["tokens"] = tokens
        return tokens > seen["first"]  # a boundary passed since the last look: hang up now

    await wait_until(reached, within=20, what=f"{rid} in {phase}")
    return seen["tokens"]


async def _occupy_the_slot(
    raw: RawClients, session: aiohttp.ClientSession, stack: Stack, rid: str
) -> asyncio.StreamWriter:
    body = {"model": MODEL, "prompt": "blocker", "max_tokens": 3000, "stream": True}
    _, writer = await raw.open(
        stack.gateway_url, completion_request("/v1/completions", body, request_id=rid)
    )
    await _wait_phase(session, stack, rid, "decode")
    return writer


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
@pytest.mark.parametrize("phase", ["queued", "prefill", "decode"])
async def test_hangup_in_each_stage_and_phase(
    stack: Stack, session: aiohttp.ClientSession, raw: RawClients, phase: str, stream: bool
) -> None:
    rid = f"hang-{phase}-{'s' if stream else 'n'}"
    blocker = (
        await _occupy_the_slot(raw, session, stack, rid + "-blocker") if phase == "queued" else None
    )
    before_gw = await scrape_async(session, stack.gateway_url)
    before_px = await scrape_async(session, stack.admin_url)
    prompt = LONG_PROMPT if phase == "prefill" else "tell me a story"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3000, "stream": stream}
    reader, writer = await raw.open(
        stack.proxy_url, completion_request("/v1/completions", body, request_id=rid)
    )
    if stream:
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    tokens_at_hangup = await _wait_phase(session, stack, rid, phase)
    writer.close()  # the hang-up

    await wait_until(lambda: _gone(session, stack, rid), within=10, what=f"{rid} cancelled")
    stage = "streaming" if stream else "before_response"

    async def counted() -> bool:
        px = await scrape_async(session, stack.admin_url)
        return total(px, "hangup_proxy_cancel_calls_total") > total(
            before_px, "hangup_proxy_cancel_calls_total"
        )

    await wait_until(counted, within=10, what="the proxy's cancel call to be answered")
    after_gw = await scrape_async(session, stack.gateway_url)
    after_px = await scrape_async(session, stack.admin_url)

    cancels = "hangup_gateway_cancellations_total"
    assert delta(after_gw, before_gw, cancels, reason="client_disconnect", phase=phase) == 1
    assert delta(after_gw, before_gw, cancels) == 1  # counted once, whatever noticed first
    wasted = delta(after_gw, before_gw, "hangup_gateway_wasted_tokens_total")
    assert tokens_at_hangup <= wasted <= tokens_at_hangup + 1  # at most one more engine step
    assert (
        delta(
            after_px,
            before_px,
            "hangup_proxy_client_disconnects_total",
            protocol="http",
            stage=stage,
        )
        == 1
    )
    # The explicit cancel reached the gateway first (the upstream stream stays open until it is
    # answered), so it found the request running: "ok", not "finished".
    assert (
        delta(after_px, before_px, "hangup_proxy_cancel_calls_total", adapter="hangup", result="ok")
        == 1
    )
    assert delta(after_px, before_px, "hangup_proxy_cancel_calls_total") == 1
    if blocker is not None:
        blocker.close()
        await wait_until(
            lambda: _gone(session, stack, rid + "-blocker"), within=10, what="blocker gone"
        )


async def _gone(session: aiohttp.ClientSession, stack: Stack, rid: str) -> bool:
    return rid not in await in_flight(session, stack.gateway_url)


async def test_call_log_line_names_the_hangup(
    stack: Stack, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    rid = "logged-hangup"
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3000}
    _, writer = await raw.open(
        stack.proxy_url, completion_request("/v1/completions", body, request_id=rid)
    )
    await _wait_phase(session, stack, rid, "decode")
    writer.close()

    def logged() -> list[dict[str, object]]:
        lines = [json.loads(x) for x in stack.proxy.log().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("msg") == "call" and x.get("request_id") == rid]

    await wait_until(lambda: bool(logged()), within=10, what="the call's log line")
    (line,) = logged()
    assert line["outcome"] == "cancelled" and line["reason"] == "client_disconnect"
    assert line["stage"] == "before_response" and line["status"] == 499
    assert line["cancel_result"] == "ok"
    assert isinstance(line["cancel_ms"], float) and line["cancel_ms"] > 0


async def test_hangup_mid_body_leaves_nothing_behind(
    fast: Stack, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    """The gateway never saw a whole request: the cancel finds nothing (the gateway keeps a
    tombstone), the upstream connection is closed, and nothing is left in flight."""
    _, px_before = await _scrape_both(fast, session)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: m\r\nContent-Type: application/json\r\n"
        b"Content-Length: 500\r\n\r\n"
    )
    _, writer = await raw.open(fast.proxy_url, head + b'{"model": "hangup-sim", "prompt": "')

    async def upstream_started() -> bool:
        _, px = await _scrape_both(fast, session)
        return total(px, "hangup_proxy_inflight_requests", protocol="http") == 1

    await wait_until(upstream_started, within=10, what="the call in flight at the proxy")
    writer.close()

    async def answered() -> bool:
        _, px = await _scrape_both(fast, session)
        return delta(px, px_before, "hangup_proxy_cancel_calls_total") == 1

    await wait_until(answered, within=10, what="the cancel call answered")
    _, px = await _scrape_both(fast, session)
    assert delta(px, px_before, "hangup_proxy_cancel_calls_total", result="not_found") == 1
    assert (
        delta(px, px_before, "hangup_proxy_client_disconnects_total", stage="before_response") == 1
    )
    assert await _idle(session, fast)


async def test_half_closed_client_is_a_hangup_in_the_real_process(
    fast: Stack, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    """The proxy process (uvloop) treats a client's shutdown of its write side as a hang-up."""
    gw_before, _ = await _scrape_both(fast, session)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3000}
    reader, writer = await raw.open(fast.proxy_url, completion_request("/v1/completions", body))

    async def running() -> bool:
        return len(await in_flight(session, fast.gateway_url)) == 1

    await wait_until(running, within=10, what="the call running upstream")
    writer.get_extra_info("socket").shutdown(socket.SHUT_WR)
    assert await reader.read() == b""  # no response: the proxy closed the connection
    writer.close()
    await wait_until(lambda: _idle(session, fast), within=10, what="nothing in flight")
    gw, _ = await _scrape_both(fast, session)
    assert (
        delta(gw, gw_before, "hangup_gateway_cancellations_total", reason="client_disconnect") == 1
    )
