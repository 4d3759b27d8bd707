"""The real engine behind a real Triton: vLLM's ``AsyncLLM`` in a python-backend model
(``bench/harness/triton/vllm_models/vllm_tiny``, the tiny local model, the vLLM tier's engine
options), as Triton's vLLM backend runs it, and hangup's proxy in front (``--cancel-adapter
triton``).

Client -> proxy -> Triton -> vLLM: a client's hang-up in any stage (waiting in vLLM's queue,
in a long prefill, decoding; streaming or not; HTTP or gRPC) becomes a cancelled gRPC call,
Triton's cancellation, which the model turns into ``AsyncLLM.abort``, and the engine core reports
nothing running, nothing waiting and no KV cache held afterwards (its own scheduler statistics,
which the model writes out). Direct to Triton over HTTP, the same hang-up leaves vLLM
generating every token for nobody: the baseline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tritonclient.grpc.aio as triton_aio

from bench.base.processes import Process, spawn
from bench.harness.triton.io import Stream, hang_up_http
from bench.harness.triton.server import TritonServer
from bench.harness.triton.vllm import MODEL, ended, engine_idle, triton_with_vllm
from bench.harness.triton.vllm import body as generate_body
from bench.harness.vllm_stack import LONG_PROMPT
from tests.support.vllm_fixtures import tiny_model  # noqa: F401 (fixture)
from tests.triton.conftest import bridge_args
from tests.triton.test_triton_cancel import request_id

pytestmark = pytest.mark.slow

MANY = 4_000  # tokens: a request nobody stops decodes for many seconds
SEEN_WITHIN_S = 2.0  # hang-up -> abort (the proxy, Triton, the model's 10 ms check, the core)


@pytest.fixture(scope="module")
def triton_vllm(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: Path,  # noqa: F811 (the fixture, by name)
) -> Iterator[TritonServer]:
    with triton_with_vllm(tmp_path_factory.mktemp("triton-vllm"), tiny_model) as server:
        yield server  # Unavailable where Triton cannot run: a skip


@pytest.fixture(scope="module")
def bridge(
    triton_vllm: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    with spawn(
        "proxy", bridge_args(triton_vllm), tmp_path_factory.mktemp("triton-vllm-bridge")
    ) as proc:
        yield proc
        proc.terminate()


def body(prompt: str, stream: bool, max_tokens: int = MANY) -> dict[str, Any]:
    return generate_body(prompt, stream, max_tokens)


STAGES = {  # stage: (route, prompt, events to read before hanging up, hang up after)
    "decoding, streamed": ("generate_stream", "", 3, 30.0),
    "decoding, one answer": ("generate", "", None, 0.5),
    "in a long prefill": ("generate_stream", LONG_PROMPT, None, 0.2),
}


async def hang_up(url: str, stage: str, tag: str) -> tuple[str, float]:
    route, long_prompt, events, after_s = STAGES[stage]
    prompt = long_prompt + request_id(tag)
    route_url = f"{url}/v2/models/{MODEL}/{route}"
    gone = await hang_up_http(route_url, body(prompt, route == "generate_stream"), events, after_s)
    return prompt, gone


def aborted(end: dict[str, Any], gone: float) -> None:
    assert end["how"] == "cancelled", end
    assert end["tokens"] < MANY and end["aborted"] - gone < SEEN_WITHIN_S, end


@pytest.mark.parametrize("stage", STAGES)
async def test_a_hang_up_through_the_bridge_aborts_the_request_in_vllm(
    triton_vllm: TritonServer, bridge: Process, stage: str
) -> None:
    prompt, gone = await hang_up(bridge.url(), stage, stage.split(",")[0].replace(" ", "-"))
    end = await ended(triton_vllm, prompt)
    aborted(end, gone)
    if stage == "in a long prefill":
        assert end["tokens"] == 0, end
    stats = await engine_idle(triton_vllm)
    assert stats["at"] - gone < SEEN_WITHIN_S, stats


async def test_direct_to_triton_a_hang_up_leaves_vllm_generating(triton_vllm: TritonServer) -> None:
    """The baseline: Triton's HTTP frontend never tells the model its client left."""
    prompt = request_id("direct")
    async with aiohttp.ClientSession() as session:
        try:
            async with asyncio.timeout(0.5):
                url = f"{triton_vllm.url()}/v2/models/{MODEL}/generate"
                async with session.post(url, json=body(prompt, False, 300)) as answer:
                    await answer.read()
        except TimeoutError:
            pass
    end = await ended(triton_vllm, prompt)
    assert (end["how"], end["tokens"]) == ("finished", 300), end  # every token, for nobody
    await engine_idle(triton_vllm)


async def test_a_grpc_stream_cancel_through_the_proxy_aborts_the_request_in_vllm(
    triton_vllm: TritonServer, bridge: Process
) -> None:
    client = triton_aio.InferenceServerClient(bridge.listeners["grpc"])
    try:
        stream = Stream(client, MODEL)
        prompt = request_id("grpc")
        stream.send(prompt, prompt, max_tokens=MANY, ignore_eos=True, temperature=0)
        for _ in range(3):
            _, error = await stream.next()
            assert error is None, error
        stream.responses.cancel()  # type: ignore[attr-defined]
        gone = time.time()
    finally:
        await client.close()
    aborted(await ended(triton_vllm, prompt), gone)
    await engine_idle(triton_vllm)


async def test_many_hang_ups_sequential_and_at_once_each_abort_and_free_the_engine(
    triton_vllm: TritonServer, bridge: Process
) -> None:
    """Every stage, one at a time, then sixteen streams at once (eight run, eight wait in vLLM's
    queue: ``--max-num-seqs 8``); each aborted in the engine, which is idle afterwards and
    answers the next request in full."""
    done = [await hang_up(bridge.url(), stage, f"seq{i}") for i in range(8) for stage in STAGES]
    url = f"{bridge.url()}/v2/models/{MODEL}/generate_stream"
    prompts = [request_id(f"many{i}") for i in range(16)]
    gone = await asyncio.gather(*(hang_up_http(url, body(p, True), 2, 30.0) for p in prompts))
    done += list(zip(prompts, gone, strict=True))
    for prompt, when in done:
        aborted(await ended(triton_vllm, prompt), when)
    await engine_idle(triton_vllm)
    async with aiohttp.ClientSession() as session:
        url = f"{bridge.url()}/v2/models/{MODEL}/generate"
        prompt = request_id("after")
        async with session.post(url, json=body(prompt, False, 16)) as answer:
            assert answer.status == 200, await answer.text()
    assert (await ended(triton_vllm, prompt))["tokens"] == 16
