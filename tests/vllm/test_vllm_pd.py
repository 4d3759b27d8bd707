"""A disaggregated gateway on real vLLM (tiny model, CPU): ``--worker-roles prefill,decode``.

Worker 0 prefills, worker 1 decodes; the KV goes between them through hangup's connector and
the gateway's handoff store (a directory under the gateway's ``TMPDIR``, which the tests look
into). Both workers run one request at a time (``--max-num-seqs 1``), so a call can be held in
``transfer``: its prompt is prefilled and handed over while the decode worker is still busy with
another call. A cancel lands in each phase, by the cancel API, an HTTP client hanging up, a gRPC
client cancelling its ``ModelStreamInfer`` stream or a gRPC deadline; afterwards nothing is in
flight, the store is empty and both workers' KV caches are back to empty. The answers are
compared with the shared aggregated gateway's (same model, same engine options, temperature 0).

Same engine options includes the CPU threads: vLLM-CPU reserves one more core for the KV
connector when there is one (for NIXL's thread; hangup's connector has none), which on a 2-core
machine gives each P/D worker 2 OpenMP threads where an aggregated worker has 1. On a CPU with
AMX that changed the tiny model's 24-token greedy answer, every time (3 of 3; the
same answers with one reserved core, 3 of 3), so the P/D gateway here reserves one core too
(``VLLM_CPU_NUM_OF_RESERVED_CPU=1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from bench.base.processes import Process
from bench.base.scrape import Samples, delta, scrape, total
from bench.base.waiting import poll_until
from bench.harness.triton.io import Stream, inputs
from bench.harness.vllm_stack import (
    IGNORE_EOS,
    LONG_PROMPT,
    MODEL,
    WAIT_S,
    calls_in_flight,
    engines_idle,
    vllm_gateway,
)
from tests.support.vllm_fixtures import OpenAIFor, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 20  # ~460 tokens: 3 whole blocks


@pytest.fixture(scope="module")
def pd(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("vllm-pd")
    (tmp / "tmpdir").mkdir()
    extra = ["--worker-roles", "prefill,decode", "--max-num-seqs", "1"]
    env = {"TMPDIR": str(tmp / "tmpdir"), "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}  # see module
    with vllm_gateway(tiny_model, tmp, workers=2, extra=extra, env=env) as proc:
        yield proc


def store_files(pd: Process) -> list[str]:
    """What the gateway's handoff store holds now (file names)."""
    tmpdir = pd.log_path.parent / "tmpdir"
    stores = list(tmpdir.glob("hangup-kv-handoff-*"))
    assert len(stores) == 1, f"expected one handoff store in {tmpdir}: {stores}"
    return sorted(p.name for p in stores[0].iterdir())


def all_freed(pd: Process) -> bool:
    return not calls_in_flight(pd) and not store_files(pd) and engines_idle(pd) is not None


def wait_all_freed(pd: Process) -> None:
    poll_until(lambda: all_freed(pd), WAIT_S, "no call in flight, the handoff store empty, KV idle")


def call_of(pd: Process, request_id: str) -> dict[str, Any] | None:
    return next((c for c in calls_in_flight(pd) if c.get("request_id") == request_id), None)


def phase_of(pd: Process, request_id: str) -> str | None:
    call = call_of(pd, request_id)
    return str(call["phase"]) if call else None


def cancel(pd: Process, request_id: str) -> dict[str, Any]:
    request = urllib.request.Request(pd.url() + f"/v2/requests/{request_id}/cancel", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def completion(client_for: OpenAIFor, target: Process, prompt: str, stream: bool = False) -> str:
    api = client_for(target)
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0.0,
        "extra_body": IGNORE_EOS,
    }
    if not stream:
        return str(api.completions.create(**kwargs).choices[0].text)
    return "".join(c.choices[0].text for c in api.completions.create(stream=True, **kwargs))


def test_a_pd_gateway_answers_as_an_aggregated_one(
    pd: Process, gateway: Process, client_for: OpenAIFor
) -> None:
    expected = completion(client_for, gateway, PROMPT)
    assert expected
    assert completion(client_for, pd, PROMPT) == expected
    assert completion(client_for, pd, PROMPT, stream=True) == expected
    short = "Hello world"  # no whole block to hand over: decode computes the prompt itself
    assert completion(client_for, pd, short) == completion(client_for, gateway, short)
    wait_all_freed(pd)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        yield s


async def start_stream(
    session: aiohttp.ClientSession, pd: Process, request_id: str, prompt: str, max_tokens: int
) -> aiohttp.ClientResponse:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        **IGNORE_EOS,
    }
    response = await session.post(
        pd.url() + "/v1/completions", json=body, headers={"X-Request-Id": request_id}
    )
    assert response.status == 200, await response.text()
    return response


async def wait_phase(pd: Process, request_id: str, phase: str) -> None:
    await asyncio.to_thread(
        poll_until,
        lambda: phase_of(pd, request_id) == phase,
        WAIT_S,
        f"call {request_id} in phase {phase}",
        interval=0.005,
    )


def leg_states(answer: dict[str, Any]) -> dict[str, str]:
    return {role: str(leg["state"]) for role, leg in answer["legs"].items()}


async def test_a_cancel_in_prefill_aborts_it_and_decode_never_starts(
    pd: Process, session: aiohttp.ClientSession
) -> None:
    response = await start_stream(session, pd, "pd-prefill", LONG_PROMPT, 16)
    try:
        await wait_phase(pd, "pd-prefill", "prefill")
        answer = await asyncio.to_thread(cancel, pd, "pd-prefill")
    finally:
        response.close()
    assert answer["state"] == "cancelled" and answer["phase"] == "prefill"
    assert leg_states(answer) == {"prefill": "aborted", "decode": "never_started"}
    await asyncio.to_thread(wait_all_freed, pd)


async def test_cancels_in_transfer_and_in_decode_free_both_workers_and_the_handoff(
    pd: Process, session: aiohttp.ClientSession
) -> None:
    """The first call decodes on the only decode slot; the second one's prompt is prefilled and
    handed over, and its decode leg waits for that slot: in ``transfer``, with a handoff file."""
    before = await asyncio.to_thread(scrape, pd.url())
    first = await start_stream(session, pd, "pd-decode", "Red green blue", 4000)
    second = None
    try:
        await first.content.readline()  # the first event: it is decoding
        await wait_phase(pd, "pd-decode", "decode")
        second = await start_stream(session, pd, "pd-transfer", PROMPT, 16)
        await wait_phase(pd, "pd-transfer", "transfer")
        assert len(store_files(pd)) == 1, "the handoff is held while the decode leg waits"
        held = await asyncio.to_thread(scrape, pd.url())
        assert total(held, "hangup_gateway_handoff_kv_blocks", worker="0") == 3
        assert total(held, "hangup_gateway_handoffs_in_flight") == 1  # the decoding one's: no
        in_transfer = await asyncio.to_thread(cancel, pd, "pd-transfer")
        assert store_files(pd) == [], "the cancel answered before the handoff was deleted"
        assert phase_of(pd, "pd-decode") == "decode", "the other call was touched"
        in_decode = await asyncio.to_thread(cancel, pd, "pd-decode")
    finally:
        first.close()
        if second is not None:
            second.close()
    assert in_transfer["phase"] == "transfer"
    assert leg_states(in_transfer) == {"prefill": "ended", "decode": "aborted"}
    assert in_transfer["legs"]["prefill"]["kv_blocks_freed"] == 3  # the handoff's blocks
    assert in_decode["phase"] == "decode"
    assert leg_states(in_decode) == {"prefill": "ended", "decode": "aborted"}
    await asyncio.to_thread(wait_all_freed, pd)
    after = await asyncio.to_thread(scrape, pd.url())
    for phase in ("transfer", "decode"):
        assert cancelled(after, before, "explicit", phase) == 1, phase
    assert total(after, "hangup_gateway_handoff_kv_blocks") == 0
    assert total(after, "hangup_gateway_handoffs_in_flight") == 0


async def test_a_hang_up_in_transfer_frees_the_handoff_and_both_workers(
    pd: Process, session: aiohttp.ClientSession
) -> None:
    async with held_in_transfer(session, pd, "client_disconnect"):
        leaving = await start_stream(session, pd, "pd-leaving", PROMPT, 16)
        await wait_phase(pd, "pd-leaving", "transfer")
        leaving.close()  # the client hangs up while its KV waits for the decode worker
        await asyncio.to_thread(
            poll_until,
            lambda: not store_files(pd) and not call_of(pd, "pd-leaving"),
            WAIT_S,
            "the hung-up call gone and its handoff deleted",
        )


@contextlib.asynccontextmanager
async def held_in_transfer(
    session: aiohttp.ClientSession, pd: Process, reason: str
) -> AsyncIterator[Samples]:
    """The only decode slot taken by a long stream while the body runs, so that a call the body
    makes is held in ``transfer`` until the body cancels it (by ``reason``). Yields the metrics
    from before. Afterwards: the busy stream was untouched (still decoding, so the held call was
    freed by its cancel, not by running on), it hangs up, everything is freed, and one
    cancellation of each is counted."""
    before = await asyncio.to_thread(scrape, pd.url())
    busy_id = f"pd-busy-{reason}"
    busy = await start_stream(session, pd, busy_id, "Red green blue", 4000)
    try:
        await busy.content.readline()  # decoding
        yield before
        assert phase_of(pd, busy_id) == "decode", "the other call ended or was touched"
    finally:
        busy.close()
    await asyncio.to_thread(wait_all_freed, pd)
    after = await asyncio.to_thread(scrape, pd.url())
    assert cancelled(after, before, reason, "transfer") == 1
    assert cancelled(after, before, "client_disconnect", "decode") == 1


def engine_requests(samples: Samples, worker: str) -> float:
    """Requests the worker's engine holds (running or waiting), each until its core has applied
    its abort."""
    running = total(samples, "hangup_gateway_engine_running_requests", worker=worker)
    return running + total(samples, "hangup_gateway_engine_waiting_requests", worker=worker)


async def wait_gone(pd: Process, request_id: str, reason: str, before: Samples) -> None:
    """Until the call held in ``transfer`` is counted cancelled there with ``reason`` and is
    gone, its handoff deleted and its KV blocks released, and the decode engine holds only the
    busy call (its decode leg aborted in the core)."""

    def gone() -> bool:
        now = scrape(pd.url())
        counted = cancelled(now, before, reason, "transfer") == 1
        engines = (engine_requests(now, "0"), engine_requests(now, "1")) == (0, 1)
        handoff = total(now, "hangup_gateway_handoff_kv_blocks") == 0 and not store_files(pd)
        return counted and engines and handoff and not call_of(pd, request_id)

    await asyncio.to_thread(poll_until, gone, WAIT_S, f"{request_id} cancelled ({reason}), freed")


async def test_a_grpc_stream_cancelled_in_transfer_frees_the_handoff_and_both_workers(
    pd: Process, session: aiohttp.ClientSession
) -> None:
    async with (
        held_in_transfer(session, pd, "grpc_cancelled") as before,
        triton.InferenceServerClient(pd.listeners["grpc"]) as client,
    ):
        stream = Stream(client, MODEL, headers={"x-request-id": "pd-grpc-stream"})
        stream.send("r", PROMPT, max_tokens=16, **IGNORE_EOS)
        await wait_phase(pd, "pd-grpc-stream", "transfer")
        assert len(store_files(pd)) == 1, "the handoff is held while the decode leg waits"
        stream.responses.cancel()  # the gRPC client cancels its stream
        await wait_gone(pd, "pd-grpc-stream", "grpc_cancelled", before)


async def test_a_grpc_deadline_in_transfer_frees_the_handoff_and_both_workers(
    pd: Process, session: aiohttp.ClientSession
) -> None:
    """A non-streaming ``ModelInfer`` whose 4 s deadline passes while its decode leg waits."""
    async with (
        held_in_transfer(session, pd, "deadline_exceeded") as before,
        triton.InferenceServerClient(pd.listeners["grpc"]) as client,
    ):
        infer = client.infer(
            MODEL,
            inputs(PROMPT, stream=False, max_tokens=16, **IGNORE_EOS),
            headers={"x-request-id": "pd-grpc-deadline"},
            client_timeout=4.0,
        )
        task = asyncio.create_task(infer)
        await wait_phase(pd, "pd-grpc-deadline", "transfer")
        with pytest.raises(InferenceServerException, match="Deadline"):
            await task
        await wait_gone(pd, "pd-grpc-deadline", "deadline_exceeded", before)


def cancelled(after: Samples, before: Samples, reason: str, phase: str) -> float:
    return delta(after, before, "hangup_gateway_cancellations_total", reason=reason, phase=phase)
