"""The gateway with real vLLM workers (tiny local model): completions, hang-ups, two workers.

One gateway with two workers and ``hangup-proxy`` in front serve the whole module (started once
per session). Completions and hang-ups go through the proxy, as users' traffic does; the
two-worker tests talk to the gateway directly, since they are about its routing. Each test
leaves the engines idle, so the next one starts from a known KV-cache baseline. Clients are
real: the openai client, and aiohttp for a client that hangs up on a non-streaming request.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from tokenizers import Tokenizer

from bench.base.processes import Process
from bench.base.scrape import Samples, scrape, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import (
    IGNORE_EOS,
    LONG_PROMPT,
    MODEL,
    WAIT_S,
    WORKERS,
    calls_in_flight,
    engines_idle,
)
from tests.support.vllm_fixtures import OpenAIFor, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def gateway_state(gateway: Process) -> str:
    """Calls in flight and the last request_end log lines: what a failed wait should show."""
    ends = [line for line in gateway.log().splitlines() if '"request_end"' in line]
    return f"calls in flight: {calls_in_flight(gateway)}\nlast ends:\n" + "\n".join(ends[-5:])


def cancellations(samples: Samples, phase: str) -> float:
    return total(
        samples, "hangup_gateway_cancellations_total",
        model=MODEL, reason="client_disconnect", phase=phase,
    )  # fmt: skip


def wasted(samples: Samples) -> float:
    return total(samples, "hangup_gateway_wasted_tokens_total", model=MODEL)


def test_completion_counts_tokens_with_the_model_tokenizer(
    gateway: Process, vllm_proxy: Process, tiny_model: Path, client_for: OpenAIFor
) -> None:
    prompt = "Hello world, how are you today?"
    result = client_for(vllm_proxy).completions.create(model=MODEL, prompt=prompt, max_tokens=12)
    expected_prompt_tokens = len(
        Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(prompt).ids
    )
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].text
    assert result.usage is not None
    assert result.usage.completion_tokens == 12
    assert result.usage.prompt_tokens == expected_prompt_tokens


def test_streamed_text_equals_the_non_streamed_text(
    gateway: Process, vllm_proxy: Process, client_for: OpenAIFor
) -> None:
    api = client_for(vllm_proxy)
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "Monday Tuesday", "max_tokens": 24,
                              "temperature": 0.0, "extra_body": IGNORE_EOS}  # fmt: skip
    whole = api.completions.create(**kwargs)
    pieces, finishes = [], []
    for chunk in api.completions.create(stream=True, **kwargs):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finishes.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == whole.choices[0].text
    assert finishes[-1] == "length"
    assert len([p for p in pieces if p]) > 1, "the answer came in one piece: not streamed"


def test_chat_streaming_uses_the_chat_template(
    gateway: Process, vllm_proxy: Process, client_for: OpenAIFor
) -> None:
    stream = client_for(vllm_proxy).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather like?"}],
        max_tokens=8, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text
    assert usage is not None and usage.completion_tokens == 8
    # "<s>user: What is the weather like?\n<s>assistant: " is longer than the bare question.
    assert usage.prompt_tokens > len("What is the weather like?".split())


def proxy_cancels_ok(proxy: Process) -> float:
    samples = scrape(proxy.url("admin"))
    return total(samples, "hangup_proxy_cancel_calls_total", adapter="hangup", result="ok")


def test_hang_up_in_decode_aborts_within_a_few_tokens(
    gateway: Process, vllm_proxy: Process, client_for: OpenAIFor
) -> None:
    before, cancels_before = scrape(gateway.url()), proxy_cancels_ok(vllm_proxy)
    stream = client_for(vllm_proxy).completions.create(
        model=MODEL, prompt="Hello", max_tokens=4000, stream=True, extra_body=IGNORE_EOS
    )
    received = 0
    for chunk in stream:
        received += 1 if chunk.choices and chunk.choices[0].text else 0
        if received == 20:
            break
    stream.close()  # the client hangs up mid-stream

    after = poll_until(
        lambda: (
            (s := scrape(gateway.url()))
            and cancellations(s, "decode") > cancellations(before, "decode")
            and s
        ),
        WAIT_S,
        "the hang-up to be counted as a cancellation in decode",
    )
    poll_until(lambda: engines_idle(gateway), WAIT_S, "the engine to free the slot and KV cache")
    poll_until(
        lambda: proxy_cancels_ok(vllm_proxy) > cancels_before, WAIT_S, "the proxy's cancel call"
    )
    tokens_after_hang_up = wasted(after) - wasted(before) - received
    # Decode makes one token per step; the engine steps every ~2 ms on a CPU with this model,
    # so the few milliseconds from the hang-up to the abort cost a few steps, never hundreds.
    assert 0 <= tokens_after_hang_up <= 16, tokens_after_hang_up


async def _post_until_prefill(
    gateway: Process, front: Process, body: dict[str, Any]
) -> dict[str, float]:
    """POST ``body`` to ``front``, hang up once the gateway reports the call in prefill; return
    the KV usage per worker seen at that moment."""
    call_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        # A streaming response has its headers at once; a non-streaming one has nothing yet.
        task = asyncio.create_task(session.post(
            front.url() + "/v1/completions", json=body, headers={"X-Request-Id": call_id}
        ))  # fmt: skip

        def in_prefill() -> bool:
            return any(c["request_id"] == call_id and c["phase"] == "prefill"
                       for c in calls_in_flight(gateway))  # fmt: skip

        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(in_prefill):
            assert time.monotonic() < deadline, "the call was never reported in prefill"
        samples = await asyncio.to_thread(scrape, gateway.url())
        # The client hangs up: aiohttp closes the connection.
        if task.done():
            task.result().close()
        else:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    kv = "hangup_gateway_engine_kv_cache_usage_ratio"
    return {w: total(samples, kv, worker=w) for w in WORKERS}


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_hang_up_in_prefill_frees_the_kv_cache(
    gateway: Process, vllm_proxy: Process, stream: bool
) -> None:
    before = await asyncio.to_thread(scrape, gateway.url())
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 50, "stream": stream, **IGNORE_EOS}
    kv_during = await _post_until_prefill(gateway, vllm_proxy, body)
    assert max(kv_during.values()) > 0, "the long prompt should hold KV-cache blocks in prefill"

    def counted() -> dict[str, float] | None:
        s = scrape(gateway.url())
        return s if cancellations(s, "prefill") > cancellations(before, "prefill") else None

    after = await asyncio.to_thread(
        poll_until, counted, WAIT_S, "a cancellation counted in prefill"
    )
    await asyncio.to_thread(
        poll_until, lambda: engines_idle(gateway), WAIT_S, "the KV cache to be freed"
    )
    assert wasted(after) == wasted(before), "no token should have been generated"


def test_requests_spread_over_both_workers_and_cancels_reach_the_owner(
    gateway: Process, client_for: OpenAIFor
) -> None:
    api = client_for(gateway)
    ids = [uuid.uuid4().hex for _ in WORKERS]
    streams = [
        api.completions.create(
            model=MODEL,
            prompt="Red green blue",
            max_tokens=4000,
            stream=True,
            extra_body=IGNORE_EOS,
            extra_headers={"X-Request-Id": call_id},
        )
        for call_id in ids
    ]
    try:
        for s in streams:
            next(iter(s))  # both are decoding

        def running(samples: Samples, worker: str) -> float:
            return total(samples, "hangup_gateway_engine_running_requests", worker=worker)

        poll_until(
            lambda: (s := scrape(gateway.url())) and all(running(s, w) == 1 for w in WORKERS),
            WAIT_S,
            "one running request on each worker",
        )
        first = urllib.request.Request(
            gateway.url() + f"/v2/requests/{ids[0]}/cancel", method="POST"
        )
        with urllib.request.urlopen(first, timeout=30) as response:
            assert response.status == 200
        # Only the owner of the first call stopped running; the other still decodes.
        samples = poll_until(
            lambda: (
                (s := scrape(gateway.url()))
                and sorted(running(s, w) for w in WORKERS) == [0, 1]
                and s
            ),
            WAIT_S,
            "the owner of the cancelled call to stop running it",
        )
        owner = next(w for w in WORKERS if running(samples, w) == 0)
        with pytest.raises(openai.APIError):
            for _ in streams[0]:
                pass
        assert next(iter(streams[1])).choices is not None
    finally:
        for s in streams:
            s.close()
    poll_until(lambda: engines_idle(gateway), WAIT_S, "both workers idle")
    assert owner in WORKERS


async def test_hang_up_while_queued_behind_full_batches(gateway: Process) -> None:
    """Both workers run ``--max-num-seqs`` (8) streams; one more request waits in vLLM's queue,
    is reported ``queued``, and its hang-up is counted in that phase."""
    before = await asyncio.to_thread(scrape, gateway.url())
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4000, "stream": True, **IGNORE_EOS}
    url = gateway.url() + "/v1/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = [await session.post(url, json=body) for _ in range(16)]
        try:

            def batches_full() -> bool:
                s = scrape(gateway.url())
                return all(
                    total(s, "hangup_gateway_engine_running_requests", worker=w) == 8
                    for w in WORKERS
                )

            await asyncio.to_thread(
                poll_until, batches_full, WAIT_S, "8 running requests on each worker"
            )
            call_id = uuid.uuid4().hex
            waiter = asyncio.create_task(session.post(
                url, json={**body, "stream": False}, headers={"X-Request-Id": call_id}
            ))  # fmt: skip

            def queued() -> bool:
                return any(c["request_id"] == call_id and c["phase"] == "queued"
                           for c in calls_in_flight(gateway))  # fmt: skip

            await asyncio.to_thread(poll_until, queued, WAIT_S, "the extra request reported queued")
            samples = await asyncio.to_thread(scrape, gateway.url())
            waiting = [total(samples, "hangup_gateway_engine_waiting_requests", worker=w)
                       for w in WORKERS]  # fmt: skip
            assert sorted(waiting) == [0, 1], waiting
            waiter.cancel()  # the client hangs up
            with pytest.raises(asyncio.CancelledError):
                await waiter

            def counted() -> bool:
                return cancellations(scrape(gateway.url()), "queued") > cancellations(
                    before, "queued"
                )

            await asyncio.to_thread(
                poll_until, counted, WAIT_S, "a cancellation counted as queued",
                explain=lambda: gateway_state(gateway),
            )  # fmt: skip
        finally:
            for response in streams:
                response.close()
    await asyncio.to_thread(
        poll_until, lambda: engines_idle(gateway), WAIT_S, "the engines idle again"
    )


def _ended(gateway: Process, call_id: str) -> dict[str, Any] | None:
    """The ``request_end`` line of ``call_id``'s engine request, once written."""
    for text in reversed(gateway.log().splitlines()):
        if '"request_end"' in text and call_id in text:
            line: dict[str, Any] = json.loads(text)
            return line if line["call_id"] == call_id else None
    return None


@pytest.mark.parametrize("how", ["cancel", "hang-up"])
async def test_a_call_cancelled_in_prefill_is_billed_vllms_own_prompt_count(
    gateway: Process, tiny_model: Path, how: str
) -> None:
    """vLLM sends nothing for a request before its first token, so the gateway never reads a
    chunk of a call cancelled in prefill: the prompt's tokens come from the final output vLLM's
    front end makes for the abort, read after the abort whether or not anyone reads the stream
    (a hang-up closed it). The count is vLLM's, equal to the model's tokenizer's."""
    expected = len(Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(LONG_PROMPT).ids)
    reason = "explicit" if how == "cancel" else "client_disconnect"
    counted = "hangup_gateway_cancelled_prompt_tokens_total"
    before = await asyncio.to_thread(scrape, gateway.url())
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 50, "stream": True, **IGNORE_EOS}
    call_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        response = await session.post(gateway.url() + "/v1/completions", json=body,
                                      headers={"X-Request-Id": call_id})  # fmt: skip

        def in_prefill() -> bool:
            return any(c["request_id"] == call_id and c["phase"] == "prefill"
                       for c in calls_in_flight(gateway))  # fmt: skip

        await asyncio.to_thread(poll_until, in_prefill, WAIT_S, "the call in prefill")
        if how == "cancel":
            cancel = f"{gateway.url()}/v2/requests/{call_id}/cancel"
            async with session.post(cancel) as answered:
                answer = await answered.json()
            assert answer["phase"] == "prefill", answer
            assert answer["usage"] == {"prompt_tokens": expected, "completion_tokens": 0,
                                       "total_tokens": expected}, answer  # fmt: skip
            end = json.loads((await response.text()).strip().splitlines()[-1][6:])
            assert end["usage"] == answer["usage"] and end["error"]["type"] == "cancelled"
        else:
            response.close()  # the client hangs up
    line = await asyncio.to_thread(
        poll_until, lambda: _ended(gateway, call_id), WAIT_S, "the request_end line"
    )
    assert (line["reason"], line["phase"]) == (reason, "prefill"), line
    assert (line["prompt_tokens"], line["generated_tokens"]) == (expected, 0), line
    assert line["prefill_s"] > 0 and line["decode_s"] == 0, line
    after = await asyncio.to_thread(scrape, gateway.url())
    spent = total(after, counted, reason=reason, phase="prefill") - total(
        before, counted, reason=reason, phase="prefill")  # fmt: skip
    assert spent == expected
    await asyncio.to_thread(poll_until, lambda: engines_idle(gateway), WAIT_S, "idle engines")
