"""Disaggregated prefill/decode with the simulated engine: one prefill worker, one decode worker.

Cancels and hang-ups timed (by the phase ``GET /v2/requests`` shows) to land in every phase,
the transfer included (made long here), streaming and not, HTTP and gRPC. After each: nothing
in flight, both workers' KV back to idle, no handoff held, the cancellation counted once with
its phase. Then the fault switches: what breaks elsewhere, and the cancel frees both sides anyway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from bench.base.waiting import wait_until
from bench.harness.triton.io import Stream, inputs
from gateway_server.engine.sim.config import SimConfig
from hangup_contract.protos import cancellation_pb2
from tests.support.gateway import MODEL, Gateway, running_gateway

TOKEN = "pd-token"
PROMPT = "word " * 400
"""400 tokens: 50 prefill steps of 8 tokens, 25 KV blocks."""
BLOCKS = 25
SIM = SimConfig(
    slots=2,
    step_base_s=0.002,
    prefill_chunk_tokens=8,
    prefill_per_token_s=0.0015,
    transfer_per_block_s=0.04,
)
"""About 0.7 s of prefill and 1 s of transfer for :data:`PROMPT`: long enough to land in."""
PHASES = ("queued", "prefill", "transfer", "decode")


@pytest.fixture
async def pd() -> AsyncIterator[Gateway]:
    async with running_gateway(
        sim=SIM, token=TOKEN, workers=2, worker_roles="prefill,decode", sim_faults=True
    ) as gw:
        yield gw


async def start(
    gw: Gateway, rid: str, *, stream: bool, max_tokens: int = 2000
) -> asyncio.Task[Any]:
    """A completion running in a task (its answer: status and body text)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}

    async def call() -> tuple[int, str]:
        async with gw.session.post(
            f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": rid}
        ) as resp:
            return resp.status, await resp.text()

    task = asyncio.create_task(call())
    await wait_until(lambda: gw.phase_of(rid), what=f"{rid} in flight")
    return task


async def reach(gw: Gateway, rid: str, phase: str) -> None:
    async def there() -> bool:
        return await gw.phase_of(rid) == phase

    await wait_until(there, what=f"{rid} in {phase}", explain=lambda: f"phase of {rid}")


def assert_all_freed(gw: Gateway) -> None:
    """Both workers idle, their KV back to 0, no handoff held anywhere."""
    for worker in gw.server.pool.workers:
        load = worker.engine.load()
        assert (load.running, load.waiting, load.kv_cache_usage) == (0, 0, 0.0), worker.name
        role = worker.role.value
        held = gw.metric("hangup_gateway_engine_kv_blocks_held", worker=worker.name, role=role)
        assert held == 0, worker.name
        assert gw.metric("hangup_gateway_handoff_kv_blocks", worker=worker.name) == 0
    assert gw.metric("hangup_gateway_handoffs_in_flight") == 0


async def fault(gw: Gateway, worker: str, kind: str) -> None:
    url = f"{gw.url}/v2/admin/workers/{worker}/fault"
    async with gw.session.post(url, json={"fault": kind}, headers=gw.auth()) as resp:
        assert resp.status == 200, await resp.text()


async def test_a_call_runs_its_prompt_on_one_worker_and_generates_on_the_other() -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "seed": 5}
    texts = []
    for roles in ("", "prefill,decode"):
        async with running_gateway(sim=SIM, workers=2, worker_roles=roles) as gw:
            async with gw.session.post(f"{gw.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                texts.append((await resp.json())["choices"][0]["text"])
            if roles:
                steps = [w.engine.steps for w in gw.server.pool.workers]  # type: ignore[attr-defined]
                assert all(steps), f"both workers ran steps: {steps}"
                assert gw.requests("completed") == 1
                assert_all_freed(gw)
    assert texts[0] == texts[1] and texts[0]


async def test_the_listing_shows_each_leg(pd: Gateway) -> None:
    task = await start(pd, "listed", stream=True)
    await reach(pd, "listed", "prefill")
    legs = (await pd.in_flight())["listed"]["legs"]
    assert [(leg["role"], leg["worker"], leg["state"]) for leg in legs] == [
        ("prefill", "0", "running"),
        ("decode", None, "pending"),
    ]
    await reach(pd, "listed", "decode")
    legs = (await pd.in_flight())["listed"]["legs"]
    assert [(leg["worker"], leg["state"]) for leg in legs] == [("0", "ended"), ("1", "running")]
    assert legs[1]["engine_request_id"].startswith("listed-")
    await pd.cancel("listed")
    await task


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("phase", ["prefill", "transfer", "decode"])
async def test_a_cancel_in_each_phase_frees_both_legs_before_it_answers(
    pd: Gateway, phase: str, stream: bool
) -> None:
    task = await start(pd, "c", stream=stream)
    await reach(pd, "c", phase)
    if phase == "prefill":
        prefill_worker = pd.server.pool.workers[0].engine
        await wait_until(lambda: prefill_worker.load().kv_cache_usage > 0, what="a block read")
    status, answer = await pd.cancel("c")
    assert_all_freed(pd)  # confirmed before the answer came
    assert (status, answer["state"], answer["phase"]) == (200, "cancelled", phase)
    prefill, decode = answer["legs"]["prefill"], answer["legs"]["decode"]
    assert prefill["worker"] == "0"
    if phase == "prefill":
        assert (prefill["state"], decode["state"]) == ("aborted", "never_started")
        assert prefill["kv_blocks_freed"] > 0 and decode["kv_blocks_freed"] == 0
    elif phase == "transfer":  # the prefill's KV was still held, and the decode's allocation
        assert prefill["kv_blocks_freed"] == decode["kv_blocks_freed"] == BLOCKS
    else:  # decode pulled the prefill's KV: nothing was left there
        assert (prefill["state"], prefill["kv_blocks_freed"]) == ("ended", 0)
        assert decode["state"] == "aborted" and decode["kv_blocks_freed"] >= BLOCKS
    assert answer["usage"]["prompt_tokens"] == 400  # the prefill engine's count, in any phase
    status_code, _ = await task
    assert status_code == (200 if stream else 499)
    await wait_until(lambda: len(pd.server.registry) == 0, what="the call to close")
    assert pd.cancellations("explicit", phase) == 1 and pd.requests("cancelled") == 1
    assert pd.metric("hangup_gateway_cancel_to_freed_seconds_count", model=MODEL) == 1
    counted = "hangup_gateway_cancelled_prompt_tokens_total"
    assert pd.metric(counted, model=MODEL, reason="explicit", phase=phase) == 400
    spent = {
        p: pd.metric("hangup_gateway_cancelled_phase_seconds_total", model=MODEL,
                     reason="explicit", phase=p)
        for p in PHASES
    }  # fmt: skip
    reached = ("prefill",) if phase == "prefill" else ("prefill", "transfer")
    assert all(spent[p] > 0 for p in reached), spent  # the transfer's time apart from prefill's
    assert phase != "prefill" or spent["transfer"] == spent["decode"] == 0, spent


async def test_two_cancels_at_once_both_answer_only_once_everything_is_freed(pd: Gateway) -> None:
    task = await start(pd, "twice", stream=True)
    await reach(pd, "twice", "transfer")
    cancels = {asyncio.create_task(pd.cancel("twice")) for _ in range(2)}
    while cancels:
        done, cancels = await asyncio.wait(cancels, return_when=asyncio.FIRST_COMPLETED)
        assert_all_freed(pd)  # whichever answered, the second one too
        for answered in done:
            status, answer = answered.result()
            assert (status, answer["phase"]) == (200, "transfer")
            assert answer["legs"]["prefill"]["kv_blocks_freed"] == BLOCKS
    await task
    assert pd.cancellations("explicit", "transfer") == 1


async def test_a_cancel_while_queued_never_starts_either_leg(pd: Gateway) -> None:
    first = await start(pd, "first", stream=True)
    second = await start(pd, "second", stream=True)
    third = await start(pd, "third", stream=True)  # two slots on the prefill worker: it waits
    await reach(pd, "third", "queued")
    status, answer = await pd.cancel("third")
    assert (status, answer["phase"]) == (200, "queued")
    assert answer["legs"]["prefill"]["kv_blocks_freed"] == 0
    assert answer["legs"]["decode"]["state"] == "never_started"
    for rid in ("first", "second"):
        await pd.cancel(rid)
    await asyncio.gather(first, second, third)
    await wait_until(lambda: len(pd.server.registry) == 0, what="the calls to close")
    assert_all_freed(pd)
    assert pd.cancellations("explicit", "queued") == 1


async def test_a_cancel_that_came_first_covers_both_legs(pd: Gateway) -> None:
    status, _ = await pd.cancel("early", reason="client_disconnect")
    assert status == 404
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5}
    headers = {"X-Request-Id": "early"}
    async with pd.session.post(f"{pd.url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 499
    assert [w.engine.steps for w in pd.server.pool.workers] == [0, 0]  # type: ignore[attr-defined]
    assert pd.cancellations("client_disconnect", "queued") == 1


async def hang_up_in(gw: Gateway, phase: str, stream: bool) -> None:
    """A client hangs up in ``phase``: counted once as a ``client_disconnect`` there, and
    everything is freed."""
    async with aiohttp.ClientSession() as client:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "stream": stream}
        request = client.post(f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": "h"})
        task = asyncio.create_task(request)
        await wait_until(lambda: gw.phase_of("h"), what="the call in flight")
        await reach(gw, "h", phase)
        if stream:  # the head came at once: the client closes the stream
            (await task).close()
        else:  # nothing came yet: the client gives up waiting
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    await wait_until(lambda: len(gw.server.registry) == 0, what="the call to close")
    counted = {p: gw.cancellations("client_disconnect", p) for p in PHASES}
    assert counted == {p: float(p == phase) for p in PHASES}
    assert_all_freed(gw)
    assert gw.requests("cancelled") == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("phase", ["prefill", "transfer", "decode"])
async def test_a_client_that_hangs_up_in_each_phase_frees_both_legs(
    pd: Gateway, phase: str, stream: bool
) -> None:
    await hang_up_in(pd, phase, stream)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_hang_up_in_prefill_counts_there_however_slow_the_kv_release(
    pd: Gateway, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release of the call's KV, which its teardown awaits, returns only once the prefill
    engine has applied the abort and forgotten the leg (a slow store; on loaded cores the order
    came at random). The hang-up still counts in prefill, not in the queue."""
    engine = pd.server.pool.workers[0].engine
    release = engine.release  # type: ignore[attr-defined]

    def forgotten() -> bool:
        load = engine.load()
        return load.running == 0 and load.waiting == 0

    async def slow_release(key: str) -> int:
        await wait_until(forgotten, what="the prefill engine to apply the abort")
        return int(await release(key))

    monkeypatch.setattr(engine, "release", slow_release)
    await hang_up_in(pd, "prefill", stream)


async def test_grpc_cancels_of_a_stream_and_by_id_in_transfer(pd: Gateway) -> None:
    address = pd.server.listeners["grpc"]
    async with triton.InferenceServerClient(address) as client:
        stream = Stream(client)
        stream.send("s", PROMPT, max_tokens=2000)
        await wait_until(lambda: len(pd.server.registry) == 1, what="the stream's call")
        call_id = next(pd.server.registry.calls()).call_id
        await reach(pd, call_id, "transfer")
        stream.responses.cancel()  # the gRPC caller cancels
        await wait_until(lambda: pd.cancellations("grpc_cancelled", "transfer") == 1)
    await wait_until(lambda: len(pd.server.registry) == 0, what="the call to close")
    assert_all_freed(pd)

    task = await start(pd, "by-id", stream=False)
    await reach(pd, "by-id", "transfer")
    async with grpc.aio.insecure_channel(address) as channel:
        cancel = channel.unary_unary(
            "/hangup.v1.Cancellation/Cancel",
            request_serializer=cancellation_pb2.CancelRequest.SerializeToString,
            response_deserializer=cancellation_pb2.CancelResponse.FromString,
        )
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        answer = await cancel(cancellation_pb2.CancelRequest(request_id="by-id"), metadata=metadata)
    assert (answer.state, answer.phase) == ("cancelled", "transfer")
    assert_all_freed(pd)
    await task
    assert pd.cancellations("explicit", "transfer") == 1


async def test_shutdown_cancels_in_transfer_and_frees_both_legs() -> None:
    roles = "prefill,decode"
    async with running_gateway(sim=SIM, workers=2, worker_roles=roles, drain_timeout=0) as gw:
        task = await start(gw, "s", stream=True)
        await reach(gw, "s", "transfer")
        await gw.server.shutdown()
        await task
        assert gw.cancellations("shutdown", "transfer") == 1
        assert_all_freed(gw)


# -- faults ----------------------------------------------------------------------------------


async def test_a_lost_notification_leaves_the_prefill_kv_to_the_gateway(pd: Gateway) -> None:
    told = await start(pd, "told", stream=True)
    await reach(pd, "told", "decode")
    assert pd.metric("hangup_gateway_handoff_kv_blocks", worker="0") == 0  # freed once pulled
    assert pd.metric("hangup_gateway_handoffs_in_flight") == 0  # no longer in transfer
    await pd.cancel("told")
    await told
    await fault(pd, "0", "lose_notification")
    done = await start(pd, "lost", stream=False, max_tokens=30)
    await reach(pd, "lost", "decode")
    assert pd.metric("hangup_gateway_handoff_kv_blocks", worker="0") == BLOCKS  # never told
    status, text = await done
    assert status == 200 and json.loads(text)["choices"][0]["finish_reason"] == "length"
    assert_all_freed(pd)  # the gateway released it when the call ended

    running = await start(pd, "lost-2", stream=True)
    await reach(pd, "lost-2", "decode")
    _, answer = await pd.cancel("lost-2")
    assert answer["legs"]["prefill"]["kv_blocks_freed"] == BLOCKS
    assert_all_freed(pd)
    await running


async def test_an_expired_lease_makes_decode_recompute_the_prompt(pd: Gateway) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "seed": 1}
    async with pd.session.post(f"{pd.url}/v1/completions", json=body) as resp:
        expected = (await resp.json())["choices"][0]["text"]
    post = pd.session.post(f"{pd.url}/v1/completions", json=body, headers={"X-Request-Id": "x"})
    task = asyncio.create_task(post)
    await wait_until(lambda: pd.phase_of("x"), what="the call in flight")
    await reach(pd, "x", "transfer")
    await fault(pd, "0", "expire_leases")
    assert pd.metric("hangup_gateway_handoff_kv_blocks", worker="0") == 0
    await reach(pd, "x", "prefill")  # the decode worker found no KV: it reads the prompt itself
    async with await task as resp:
        assert (await resp.json())["choices"][0]["text"] == expected
    assert_all_freed(pd)


async def test_a_decode_leg_whose_kv_never_arrives_is_freed_by_the_cancel(pd: Gateway) -> None:
    await fault(pd, "1", "stall_transfer")
    task = await start(pd, "stuck", stream=True)
    await reach(pd, "stuck", "transfer")
    assert pd.metric("hangup_gateway_handoffs_in_flight") == 1
    assert pd.metric("hangup_gateway_inflight_requests", model=MODEL, phase="transfer") == 1
    assert pd.metric("hangup_gateway_engine_kv_blocks_held", worker="1", role="decode") == BLOCKS
    _, answer = await pd.cancel("stuck")
    assert answer["phase"] == "transfer"
    assert answer["legs"]["prefill"]["kv_blocks_freed"] == BLOCKS
    assert answer["legs"]["decode"]["kv_blocks_freed"] == BLOCKS
    assert_all_freed(pd)
    await task


async def test_a_decode_worker_that_dies_in_transfer_leaves_nothing_held(pd: Gateway) -> None:
    task = await start(pd, "dies", stream=False)
    await reach(pd, "dies", "transfer")
    await fault(pd, "1", "kill")
    status, text = await task
    assert status == 500 and "engine worker 1" in text
    assert pd.metric("hangup_gateway_handoff_kv_blocks", worker="0") == 0
    assert pd.metric("hangup_gateway_handoffs_in_flight") == 0
    assert pd.requests("error") == 1


async def test_a_grpc_deadline_in_transfer_frees_both_legs(pd: Gateway) -> None:
    await fault(pd, "1", "stall_transfer")  # the call stays in transfer until its deadline
    address = pd.server.listeners["grpc"]
    async with triton.InferenceServerClient(address) as client:
        with pytest.raises(InferenceServerException, match="Deadline"):
            await client.infer(
                MODEL, inputs(PROMPT, stream=False, max_tokens=2000), client_timeout=2.0
            )
    await wait_until(lambda: pd.cancellations("deadline_exceeded", "transfer") == 1)
    await wait_until(lambda: len(pd.server.registry) == 0, what="the call to close")
    assert_all_freed(pd)


async def test_each_choice_of_a_call_has_its_own_legs_and_one_cancel_frees_them_all(
    pd: Gateway,
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "n": 2}
    post = pd.session.post(f"{pd.url}/v1/completions", json=body, headers={"X-Request-Id": "n2"})
    task = asyncio.create_task(post)
    await wait_until(lambda: pd.phase_of("n2"), what="the call in flight")
    decoding = {"model": MODEL, "phase": "decode"}
    await wait_until(
        lambda: pd.metric("hangup_gateway_inflight_requests", **decoding) == 2, what="both decode"
    )
    assert len((await pd.in_flight())["n2"]["legs"]) == 4  # two requests, two legs each
    _, answer = await pd.cancel("n2")
    assert_all_freed(pd)
    assert answer["legs"]["decode"]["engine_request_id"] == ["n2-1-decode", "n2-2-decode"]
    assert answer["legs"]["prefill"]["kv_blocks_freed"] == 0  # both pulled by decode
    async with await task as resp:
        assert resp.status == 499
    assert pd.requests("cancelled") == 2
