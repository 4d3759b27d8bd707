"""Two measurements ``bench.pd.cancel`` makes with plain aiohttp clients through the proxy:

- the *probe*: one streaming completion, alone, its phases read from the gateway's
  ``GET /v2/requests`` every few milliseconds: when it entered ``transfer``, its first token,
  its end (from the moment its request was written), to choose AIPerf's cancellation delays;
- Dynamo's *head-of-line* test: a short streaming completion's time to first token and to its
  end, on an idle gateway and right after ten long prompts were cancelled (hang-ups) while
  queued or in prefill. Dynamo's prefill leg was not tied to the client, so ten cancelled
  prefills still ran and held up the next request (dynamo issues 14507, 13691).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp

from bench.base.scrape import scrape_async
from bench.harness.vllm_stack import LONG_PROMPT, MODEL
from bench.pd.stack import Stack, calls, cancellations, wait_freed

PROBE_PROMPT = "The quick brown fox jumps over the lazy dog. " * 20  # ~460 tokens
SHORT_PROMPT = "Say something short about the weather today."
LONG_CALLS = 10
SHORT_TOKENS = 16
WAIT_S = 60.0


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.0}  # fmt: skip


@dataclass
class Timed:
    first_token: float = float("nan")
    end: float = float("nan")


async def stream(session: aiohttp.ClientSession, url: str, rid: str, prompt: str,
                 max_tokens: int) -> Timed:  # fmt: skip
    """A streaming completion to its end; seconds from sending to its first event and end."""
    timed = Timed()
    t0 = time.monotonic()
    headers = {"X-Request-Id": rid}
    async with session.post(url + "/v1/completions", json=body(prompt, max_tokens),
                            headers=headers) as response:  # fmt: skip
        if response.status != 200:
            raise RuntimeError(f"{rid}: {response.status} {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data: {") and math.isnan(timed.first_token):
                timed.first_token = time.monotonic() - t0
    timed.end = time.monotonic() - t0
    return timed


async def probe(session: aiohttp.ClientSession, stack: Stack, rid: str, prompt: str,
                max_tokens: int) -> dict[str, float]:  # fmt: skip
    """One call alone: seconds to each phase first seen, its first token and its end."""
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    task = asyncio.create_task(stream(session, stack.url, rid, prompt, max_tokens))
    while not task.done():
        for call in await calls(session, stack.gateway_url):
            if call.get("request_id") == rid:
                seen.setdefault(str(call["phase"]), time.monotonic() - t0)
        await asyncio.sleep(0.003)
    timed = await task
    return {**seen, "first_token": timed.first_token, "end": timed.end}


async def _long_calls_in_prefill(session: aiohttp.ClientSession, stack: Stack,
                                 ids: list[str]) -> dict[str, str]:  # fmt: skip
    """Wait until every long call is known to the gateway and one prefills; their phases."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        phases = {str(c["request_id"]): str(c["phase"])
                  for c in await calls(session, stack.gateway_url)}  # fmt: skip
        if all(i in phases for i in ids) and "prefill" in {phases[i] for i in ids}:
            return {i: phases[i] for i in ids}
        await asyncio.sleep(0.005)
    raise TimeoutError(f"the {len(ids)} long calls were not all in the gateway with one in prefill")


async def after_cancelled_prefills(
    session: aiohttp.ClientSession, stack: Stack, tag: str, wait_freed_first: bool = False
) -> dict[str, object]:
    """Ten long prompts, hung up while queued or in prefill, then the short call: at once, or
    once the gateway has freed everything (``wait_freed_first``: what the ten cost, apart from
    what their cancels cost)."""
    ids = [f"{tag}-long-{i}" for i in range(LONG_CALLS)]
    before = await scrape_async(session, stack.gateway_url)
    files0 = stack.store_files()
    tasks = [asyncio.create_task(stream(session, stack.url, i, LONG_PROMPT, SHORT_TOKENS))
             for i in ids]  # fmt: skip
    try:
        phases = await _long_calls_in_prefill(session, stack, ids)
    finally:
        for task in tasks:
            task.cancel()  # closes each connection: the client hangs up
        await asyncio.gather(*tasks, return_exceptions=True)
    if wait_freed_first:
        await wait_freed(session, stack, files0)
    short = await stream(session, stack.url, f"{tag}-short", SHORT_PROMPT, SHORT_TOKENS)
    freed_s, left = await wait_freed(session, stack, files0)
    after = await scrape_async(session, stack.gateway_url)
    return {
        "ttft_s": short.first_token, "end_s": short.end,
        "phases_at_hangup": sorted(phases.values()),
        "cancelled_by_phase": {p: n for p, n in cancellations(after, before).items() if n},
        "freed_s": freed_s, "left": {k: v for k, v in left.items() if v},
    }  # fmt: skip


async def idle_short(session: aiohttp.ClientSession, stack: Stack, tag: str) -> dict[str, object]:
    short = await stream(session, stack.url, f"{tag}-short", SHORT_PROMPT, SHORT_TOKENS)
    return {"ttft_s": short.first_token, "end_s": short.end}


async def head_of_line(session: aiohttp.ClientSession, stack: Stack,
                       reps: int) -> dict[str, list[dict[str, object]]]:  # fmt: skip
    """``reps`` rounds, each: the short call on the idle gateway, then right after ten cancelled
    prefills, then after ten more once the gateway freed them."""
    rows: dict[str, list[dict[str, object]]] = {"none": [], "after_10": [], "after_10_freed": []}
    for rep in range(reps):
        rows["none"].append(await idle_short(session, stack, f"hol{rep}-idle"))
        rows["after_10"].append(await after_cancelled_prefills(session, stack, f"hol{rep}"))
        rows["after_10_freed"].append(
            await after_cancelled_prefills(session, stack, f"hol{rep}-freed", True)
        )
        print(f"head-of-line rep {rep + 1}: none {rows['none'][-1]}, "
              f"after 10 {rows['after_10'][-1]}, once freed {rows['after_10_freed'][-1]}",
              flush=True)  # fmt: skip
    return rows
