"""A real Triton (2.51.0): what reaches its model when a client goes, direct and through hangup's
proxy. The models (``bench/harness/triton/models``) check ``is_cancelled()`` every 50 ms step and
record how each request ended, so every assertion is what the model itself saw.

Over gRPC a cancelled or expired call is Triton's cancellation, and the proxy's gRPC relay turns
a client's cancel or deadline into exactly that: the model stops within a step or two, direct and
through the proxy alike, one call at a time and sixteen at once. A request cancelled while it
waits in Triton's queue is still handed to the model, which sees the cancellation before its
first step.

Over HTTP, Triton notices nothing (Triton issue 7077): a client that hangs up on ``generate``
leaves the model running to its end, and on ``generate_stream`` the hang-up is seen only at the
next write, after a silent phase such as a long prefill. These two tests are the baseline the
proxy's Triton adapter is measured against; they fail when Triton starts cancelling by itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from bench.base.processes import Process
from bench.base.scrape import parse, total
from bench.base.waiting import wait_until
from bench.harness.triton.io import Stream
from bench.harness.triton.server import TritonServer

pytestmark = pytest.mark.slow

STEP_S = 0.05  # the models' step
SEEN_WITHIN_S = 1.0  # a cancel seen later than this is late (a lost one: never, or 10-20 s)
LONG = 400  # tokens or steps: a request nobody stops runs 20 s


@pytest.fixture(params=["direct", "proxy"])
def grpc_address(request: pytest.FixtureRequest, triton: TritonServer) -> str:
    if request.param == "direct":
        return triton.grpc
    proxy: Process = request.getfixturevalue("triton_proxy")
    return proxy.listeners["grpc"]


@pytest.fixture
async def client(grpc_address: str) -> AsyncIterator[triton_aio.InferenceServerClient]:
    c = triton_aio.InferenceServerClient(grpc_address)
    try:
        yield c
    finally:
        await c.close()


def slow_inputs() -> list[triton.InferInput]:
    tensor = triton.InferInput("INPUT0", [3], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
    return [tensor]


async def ended(
    triton: TritonServer, model: str, key: object, by: str = "id", how: str | None = None
) -> dict[str, Any]:
    """The model's record of ``key`` once it ended (or once it is ``how``: ``started``)."""

    async def found() -> dict[str, Any] | None:
        line = triton.ended(model, by).get(key)
        if line is None or (how is None and line["how"] == "started"):
            return None
        return line if how is None or line["how"] == how else None

    what = f"the {model} model to end {key}"
    end: dict[str, Any] = await wait_until(found, LONG * STEP_S + 5, what)
    return end


def request_id(tag: str) -> str:
    return f"{tag}-{time.monotonic_ns()}"


async def test_a_grpc_stream_cancel_stops_the_model_within_a_step(
    triton: TritonServer, client: triton_aio.InferenceServerClient
) -> None:
    rid = request_id("stream")
    stream = Stream(client, model="streamer")
    stream.send(rid, "hello", max_tokens=LONG)
    received = 0
    for _ in range(3):
        _, error = await stream.next()
        assert error is None, error
        received += 1
    cancelled_at = time.time()
    stream.responses.cancel()
    end = await ended(triton, "streamer", rid)
    assert end["how"] == "cancelled", end
    assert end["at"] - cancelled_at < SEEN_WITHIN_S, end
    assert end["tokens"] <= received + 2, end  # made while the cancel crossed: a step or two


async def test_a_grpc_deadline_stops_the_model(
    triton: TritonServer, client: triton_aio.InferenceServerClient
) -> None:
    rid = request_id("deadline")
    started = time.time()
    with pytest.raises(InferenceServerException, match="DEADLINE_EXCEEDED"):
        await client.infer("slow", slow_inputs(), request_id=rid, parameters={"steps": LONG},
                           client_timeout=0.5)  # fmt: skip
    end = await ended(triton, "slow", rid)
    assert end["how"] == "cancelled", end
    assert end["at"] - started < 0.5 + SEEN_WITHIN_S, end


async def test_a_request_cancelled_in_triton_queue_never_runs_a_step(
    triton: TritonServer, client: triton_aio.InferenceServerClient
) -> None:
    """The slow model has one instance: the second request waits in Triton's queue while the
    first runs, and its deadline passes there."""
    first, second = request_id("running"), request_id("queued")
    running = asyncio.ensure_future(
        client.infer("slow", slow_inputs(), request_id=first, parameters={"steps": 20})
    )
    try:
        await ended(triton, "slow", first, how="started")  # the one instance is busy now
        with pytest.raises(InferenceServerException, match="DEADLINE_EXCEEDED"):
            await client.infer("slow", slow_inputs(), request_id=second, client_timeout=0.3)
    finally:
        result = await running
    assert result.as_numpy("OUTPUT0").tolist() == [2.0, 4.0, 6.0]
    end = await ended(triton, "slow", second)
    assert (end["how"], end["steps"]) == ("cancelled", 0), end


async def test_sixteen_streams_cancelled_at_once_each_stop_the_model(
    triton: TritonServer, client: triton_aio.InferenceServerClient
) -> None:
    streams, ids = [], [request_id(f"many{i}") for i in range(16)]
    for rid in ids:
        stream = Stream(client, model="streamer")
        stream.send(rid, "hello", max_tokens=LONG)
        streams.append(stream)
    for stream in streams:
        _, error = await stream.next()
        assert error is None, error
    cancelled_at = time.time()
    for stream in streams:
        stream.responses.cancel()
    ends = [await ended(triton, "streamer", rid) for rid in ids]
    assert [e["how"] for e in ends] == ["cancelled"] * 16, ends
    assert max(e["at"] for e in ends) - cancelled_at < SEEN_WITHIN_S, ends
    metrics = f"http://{triton.metrics}/metrics"
    async with aiohttp.ClientSession() as session, session.get(metrics) as answer:
        samples = parse(await answer.text())
    assert total(samples, "nv_inference_pending_request_count", model="streamer") == 0


# -- Triton's own HTTP frontend: the baseline ---------------------------------------------------


async def hang_up_after(url: str, body: dict[str, Any], seconds: float) -> float:
    """POST ``body`` and close the connection after ``seconds``; the time it was closed."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(seconds):
                async with session.post(url, json=body) as answer:
                    async for _ in answer.content:
                        pass
        return time.time()


async def test_triton_never_sees_an_http_client_hang_up_on_generate(triton: TritonServer) -> None:
    prompt = request_id("generate")
    body = {"text_input": prompt, "sampling_parameters": json.dumps({"max_tokens": 20})}
    await hang_up_after(f"{triton.url()}/v2/models/streamer/generate", body, 0.3)
    end = await ended(triton, "streamer", prompt, by="prompt")
    assert (end["how"], end["tokens"]) == ("finished", 20), end  # every step, for nobody


async def test_triton_sees_an_http_stream_hang_up_only_at_its_next_write(
    triton: TritonServer,
) -> None:
    prompt, silent_s = request_id("generate_stream"), 1.5
    params = {"max_tokens": LONG, "prefill_s": silent_s}
    body = {"text_input": prompt, "stream": True, "sampling_parameters": json.dumps(params)}
    started = time.time()
    await hang_up_after(f"{triton.url()}/v2/models/streamer/generate_stream", body, 0.3)
    end = await ended(triton, "streamer", prompt, by="prompt")
    assert end["how"] == "cancelled", end  # once a write failed...
    assert end["at"] - started >= silent_s, end  # ...after the silent phase, not at the hang-up
