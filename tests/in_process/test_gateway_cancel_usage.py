"""What a cancelled call consumed, wherever someone still reads it: the cancel API's answer, the
499 body, a cancelled stream's last event (OpenAI's and KServe's), a gRPC call's last response
or trailing metadata; and in the gateway's own books: the ``request_end`` log line and the
metrics by reason and phase (tokens, and seconds spent in each phase).

The simulated engine counts a prompt's words as its tokens, and its steps are slow enough here
to land a cancel in each phase.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import openai
import pytest
from tritonclient.grpc._utils import _get_inference_request

from bench.base.waiting import wait_until
from bench.harness.triton.io import inputs
from gateway_server.engine.sim.config import SimConfig
from hangup_contract.protos import cancellation_pb2
from hangup_contract.protos import inference_pb2 as pb
from tests.support.gateway import LONG, MODEL, Gateway, running_gateway

PROMPT = "one two three four five"
PROMPT_TOKENS = 5  # the simulated engine's tokens are a prompt's words
SIM = SimConfig(slots=1, step_base_s=0.005, prefill_chunk_tokens=8, prefill_per_token_s=0.0005)


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    async with running_gateway(sim=SIM) as gateway:
        yield gateway


def requests_ended(caplog: pytest.LogCaptureFixture) -> dict[str, dict[str, Any]]:
    """The ``request_end`` log lines' fields, by call id."""
    return {
        r.fields["call_id"]: r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "request_end"
    }


def cancelled(gw: Gateway, what: str, reason: str, phase: str) -> float:
    name = f"hangup_gateway_cancelled_{what}_total"
    return gw.metric(name, model=MODEL, reason=reason, phase=phase)


async def stream(gw: Gateway, rid: str, **fields: Any) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "stream": True, **fields}
    resp = await gw.session.post(f"{gw.url}/v1/completions", json=body,
                                 headers={"X-Request-Id": rid})  # fmt: skip
    assert resp.status == 200, await resp.text()
    return resp


async def events_of(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]


async def test_a_cancelled_stream_ends_with_the_usage_the_cancel_answer_says(gw: Gateway) -> None:
    resp = await stream(gw, "s1")
    for _ in range(3):  # three tokens' events (and their blank lines)
        await resp.content.readline()
        await resp.content.readline()
    status, answer = await gw.cancel("s1")
    assert status == 200 and answer["state"] == "cancelled"
    usage = answer["usage"]
    assert usage["prompt_tokens"] == PROMPT_TOKENS and usage["completion_tokens"] >= 3
    assert usage["total_tokens"] == PROMPT_TOKENS + usage["completion_tokens"]
    rest = await events_of(resp)
    assert rest[-1]["error"]["type"] == "cancelled" and rest[-1]["usage"] == usage
    # not asked for (no stream_options.include_usage): no chunk without choices
    assert all(e.get("choices") for e in rest[:-1])
    assert 3 + len(rest) - 1 <= usage["completion_tokens"]


async def test_a_stream_that_asked_for_usage_gets_its_usage_chunk_before_the_error(
    gw: Gateway,
) -> None:
    resp = await stream(gw, "s2", stream_options={"include_usage": True})
    await resp.content.readline()
    _, answer = await gw.cancel("s2")
    rest = await events_of(resp)
    chunk, end = rest[-2], rest[-1]
    assert chunk["choices"] == [] and chunk["id"] == "cmpl-s2" and chunk["usage"] == answer["usage"]
    assert end["usage"] == answer["usage"] and "error" in end


@pytest.mark.parametrize("include_usage", [False, True])
async def test_the_openai_client_reads_a_cancelled_stream_as_an_api_error(
    gw: Gateway, include_usage: bool
) -> None:
    """What a client that indexes ``chunk.choices[0]`` sees: every chunk up to the cancel, then
    ``APIError``; never a chunk without choices it did not ask for (an ``IndexError`` would
    escape its ``except openai.APIError``). One that asked gets the usage chunk first."""
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0)
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    seen: list[Any] = []
    async with client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=LONG,
            stream=True, extra_headers={"X-Request-Id": f"oai-{include_usage}"}, **options,
        )  # fmt: skip
        with pytest.raises(openai.APIError, match="cancelled"):
            async for chunk in answer:
                if chunk.choices:
                    seen.append(chunk.choices[0].delta.content)
                else:
                    seen.append(chunk.usage)
                if len(seen) == 3:
                    await gw.cancel(f"oai-{include_usage}")
    usage = seen[-1]
    if include_usage:
        assert usage.prompt_tokens > 0 and usage.completion_tokens >= 2
    else:
        assert all(isinstance(text, str) for text in seen)


async def test_a_cancelled_call_that_does_not_stream_is_answered_499_with_its_usage(
    gw: Gateway,
) -> None:
    """Two choices of one prompt: the prompt counted once, as OpenAI's usage counts it."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "n": 2}
    async with running_gateway(sim=SimConfig(step_base_s=0.005)) as two:
        call = asyncio.create_task(two.session.post(
            f"{two.url}/v1/completions", json=body, headers={"X-Request-Id": "n2"}))  # fmt: skip
        await wait_until(lambda: _in_decode(two, "n2"), what="n2 decoding")
        _, answer = await two.cancel("n2")
        async with await call as resp:
            assert resp.status == 499
            answered = await resp.json()
    assert answered["error"]["type"] == "cancelled" and answered["error"]["code"] == 499
    usage = answered["usage"]
    assert usage == answer["usage"]
    assert usage["prompt_tokens"] == PROMPT_TOKENS and usage["completion_tokens"] >= 2


async def _in_decode(gw: Gateway, rid: str) -> bool:
    entry = (await gw.in_flight()).get(rid)
    return entry is not None and entry["phase"] == "decode" and entry["generated_tokens"] >= 2


async def test_the_log_line_and_metrics_say_what_a_hung_up_request_consumed(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hangup.gateway")
    async with aiohttp.ClientSession() as client:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "stream": True}
        async with client.post(f"{gw.url}/v1/completions", json=body,
                               headers={"X-Request-Id": "gone"}) as resp:  # fmt: skip
            for _ in range(6):
                await resp.content.readline()
    await wait_until(lambda: "gone" in requests_ended(caplog), what="the hang-up's books")
    line = requests_ended(caplog)["gone"]
    assert (line["outcome"], line["reason"], line["phase"]) == (
        "cancelled", "client_disconnect", "decode")  # fmt: skip
    assert line["prompt_tokens"] == PROMPT_TOKENS and line["generated_tokens"] >= 3
    assert line["queued_s"] >= 0 and line["prefill_s"] > 0 and line["decode_s"] > 0
    assert line["transfer_s"] == 0
    spent = sum(line[f"{p}_s"] for p in ("queued", "prefill", "transfer", "decode"))
    assert spent == pytest.approx(line["duration_s"], abs=1e-5)
    reason = "client_disconnect"
    assert cancelled(gw, "prompt_tokens", reason, "decode") == PROMPT_TOKENS
    assert cancelled(gw, "output_tokens", reason, "decode") == line["generated_tokens"]
    for phase in ("prefill", "decode"):
        seconds = cancelled(gw, "phase_seconds", reason, phase)
        assert seconds == pytest.approx(line[f"{phase}_s"], abs=1e-5) and seconds > 0
    assert cancelled(gw, "prompt_tokens", "explicit", "decode") == 0


async def test_a_request_cancelled_in_the_queue_spent_its_time_there(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hangup.gateway")
    running = await stream(gw, "holds-the-slot")
    await running.content.readline()
    waiting = await stream(gw, "waits")

    async def queued() -> bool:
        return (await gw.phase_of("waits")) == "queued"

    await wait_until(queued, what="a queued request")
    _, answer = await gw.cancel("waits", reason="deadline_exceeded")
    assert answer["phase"] == "queued"
    assert answer["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 0,
                               "total_tokens": PROMPT_TOKENS}  # fmt: skip
    await events_of(waiting)
    await wait_until(lambda: "waits" in requests_ended(caplog), what="its books")
    line = requests_ended(caplog)["waits"]
    assert line["queued_s"] > 0 and line["prefill_s"] == line["decode_s"] == 0
    reason = "deadline_exceeded"
    assert cancelled(gw, "prompt_tokens", reason, "queued") == PROMPT_TOKENS
    spent = cancelled(gw, "phase_seconds", reason, "queued")
    assert spent == pytest.approx(line["queued_s"], abs=1e-5)
    assert cancelled(gw, "phase_seconds", reason, "prefill") == 0
    await gw.cancel("holds-the-slot")
    await events_of(running)


async def test_kserve_answers_say_what_a_cancelled_call_consumed_as_parameters(
    gw: Gateway,
) -> None:
    url = f"{gw.url}/v2/models/{MODEL}/generate"
    body = {"text_input": PROMPT, "parameters": {"max_tokens": LONG}}
    call = asyncio.create_task(gw.session.post(url, json=body, headers={"X-Request-Id": "k1"}))
    await wait_until(lambda: _in_decode(gw, "k1"), what="k1 decoding")
    _, answer = await gw.cancel("k1")
    async with await call as resp:
        assert resp.status == 499
        answered = await resp.json()
    assert answered["error"] == "request cancelled (explicit)"
    assert answered["parameters"] == answer["usage"]
    assert answer["usage"]["prompt_tokens"] == PROMPT_TOKENS


def _stream_request(request_id: str, prompt: str) -> bytes:
    request = _get_inference_request(
        model_name=MODEL, inputs=inputs(prompt, max_tokens=LONG), model_version="",
        request_id=request_id, outputs=None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, parameters=None,
    )  # fmt: skip
    return bytes(request.SerializeToString())


async def test_grpc_says_what_a_cancelled_request_or_call_consumed(gw: Gateway) -> None:
    """One request of a ``ModelStreamInfer`` stream cancelled alone: its error response's
    parameters; the whole call cancelled: ``CANCELLED`` with trailing metadata
    ``hangup-usage``."""
    async with grpc.aio.insecure_channel(gw.server.listeners["grpc"]) as channel:
        infer = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        requests: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def sent() -> AsyncIterator[bytes]:
            while (message := await requests.get()) is not None:
                yield message

        call = infer(sent(), metadata=(("x-request-id", "g1"),))
        requests.put_nowait(_stream_request("a", PROMPT))
        first = await call.read()
        alias = first.infer_response.parameters["hangup_request_id"].string_param
        _, answer = await gw.cancel(alias)
        while not (response := await call.read()).error_message:
            pass
        assert response.error_message.startswith("CANCELLED")
        parameters = response.infer_response.parameters
        usage = {k: parameters[k].int64_param for k in answer["usage"]}
        assert usage == answer["usage"] and usage["prompt_tokens"] == PROMPT_TOKENS
        requests.put_nowait(_stream_request("b", "six seven"))  # the stream goes on
        await call.read()
        _, whole = await gw.cancel("g1")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while True:
                await call.read()
        assert ended.value.code() == grpc.StatusCode.CANCELLED
        trailing = dict(ended.value.trailing_metadata() or ())
        told = json.loads(trailing["hangup-usage"])
        assert told["prompt_tokens"] == PROMPT_TOKENS + 2  # both requests of the call
        assert told == whole["usage"]


async def test_the_grpc_cancel_answers_with_the_usage(gw: Gateway) -> None:
    """``hangup.v1.Cancellation/Cancel`` says what ``POST /v2/requests/{id}/cancel`` says."""
    resp = await stream(gw, "gc")
    await resp.content.readline()
    async with grpc.aio.insecure_channel(gw.server.listeners["grpc"]) as channel:
        cancel = channel.unary_unary(
            "/hangup.v1.Cancellation/Cancel",
            request_serializer=cancellation_pb2.CancelRequest.SerializeToString,
            response_deserializer=cancellation_pb2.CancelResponse.FromString,
        )
        answer = await cancel(cancellation_pb2.CancelRequest(request_id="gc"))
        assert answer.state == "cancelled" and answer.HasField("usage")
        usage = answer.usage
        assert usage.prompt_tokens == PROMPT_TOKENS and usage.completion_tokens >= 1
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert (await events_of(resp))[-1]["usage"]["completion_tokens"] == usage.completion_tokens
        finished = await cancel(cancellation_pb2.CancelRequest(request_id="gc"))
        assert finished.state == "finished" and not finished.HasField("usage")


async def test_a_response_cancelled_in_the_queue_says_what_its_prompt_used(gw: Gateway) -> None:
    """The Responses API's own usage (``input_tokens``, ``output_tokens``) of a response
    cancelled before its first token: the engine's count of its prompt, not 0."""
    running = await stream(gw, "holds")
    await running.content.readline()
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0)
    async with client:
        made = asyncio.create_task(client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=LONG,
            extra_headers={"X-Request-Id": "resp-q"},
        ))  # fmt: skip

        async def queued() -> bool:
            return (await gw.phase_of("resp-q")) == "queued"

        await wait_until(queued, what="the response queued")
        _, answer = await gw.cancel("resp-q")
        answered = await made
    assert answered.status == "cancelled" and answered.usage is not None
    assert answered.usage.input_tokens > 0 and answered.usage.output_tokens == 0
    assert answered.usage.input_tokens == answer["usage"]["prompt_tokens"]
    await gw.cancel("holds")
    await events_of(running)
