"""A disaggregated gateway (simulated engine: a prefill worker and a decode worker) behind the
proxy, both as real processes: a client that hangs up in prefill, in the transfer between the
workers, or in decode is cancelled by the proxy's explicit cancel call, which the proxy counts
``ok`` (the answer's ``transfer`` phase and ``legs`` do not trouble it), and both workers' KV
is back to idle with no handoff held."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
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

GATEWAY = [
    "--workers", "2", "--worker-roles", "prefill,decode",
    "--sim-step-base", "0.005", "--sim-prefill-chunk", "8", "--sim-prefill-per-token", "0.002",
    "--sim-transfer-per-block", "0.1",
]  # fmt: skip
"""400-token prompts: about 1 s of prefill, 25 blocks and 2.5 s of transfer."""
PROMPT = "word " * 400


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("pd")
    with running_stack(tmp, GATEWAY, ["--trust-client-request-id"]) as running:
        yield running


def assert_idle(gw: Samples) -> None:
    for worker, role in (("0", "prefill"), ("1", "decode")):
        held = total(gw, "hangup_gateway_engine_kv_blocks_held", worker=worker, role=role)
        assert held == 0, worker
        assert total(gw, "hangup_gateway_handoff_kv_blocks", worker=worker) == 0
        assert total(gw, "hangup_gateway_engine_running_requests", worker=worker) == 0
    assert total(gw, "hangup_gateway_handoffs_in_flight") == 0


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
@pytest.mark.parametrize("phase", ["prefill", "transfer", "decode"])
async def test_a_hangup_in_each_phase_frees_both_workers(
    stack: Stack, session: aiohttp.ClientSession, raw: RawClients, phase: str, stream: bool
) -> None:
    rid = f"pd-{phase}-{'s' if stream else 'n'}"
    before_gw = await scrape_async(session, stack.gateway_url)
    before_px = await scrape_async(session, stack.admin_url)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3000, "stream": stream}
    reader, writer = await raw.open(
        stack.proxy_url, completion_request("/v1/completions", body, request_id=rid)
    )
    if stream:
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")

    async def reached() -> bool:
        entry = (await in_flight(session, stack.gateway_url)).get(rid)
        return entry is not None and entry["phase"] == phase

    await wait_until(reached, within=20, what=f"{rid} in {phase}")
    writer.close()  # the hang-up

    async def answered() -> bool:
        px = await scrape_async(session, stack.admin_url)
        calls = "hangup_proxy_cancel_calls_total"
        return rid not in await in_flight(session, stack.gateway_url) and total(px, calls) > total(
            before_px, calls
        )

    await wait_until(answered, within=10, what="the proxy's cancel call answered, the call gone")
    after_gw = await scrape_async(session, stack.gateway_url)
    after_px = await scrape_async(session, stack.admin_url)
    cancels = "hangup_gateway_cancellations_total"
    assert delta(after_gw, before_gw, cancels, reason="client_disconnect", phase=phase) == 1
    assert delta(after_gw, before_gw, cancels) == 1
    calls = "hangup_proxy_cancel_calls_total"
    assert delta(after_px, before_px, calls, adapter="hangup", result="ok") == 1
    assert delta(after_px, before_px, calls) == 1
    assert_idle(after_gw)
