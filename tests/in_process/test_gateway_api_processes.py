"""The cancel contract across API processes (``--api-processes``), with the landing chosen.

Three API processes of one gateway run in this test process, each on a port of its own, talking
over their Unix sockets as separate processes do (``gateway_server.siblings``). So a test picks
where a request runs, where its cancel lands, and which process is the id's home: a cancel that
lands on a process that neither runs the request nor is its home takes both hops. The real
supervisor, shared ports and separate processes: ``multi_process/test_gateway_api_processes.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import tritonclient.grpc.aio as triton

from bench.base.scrape import parse, total
from bench.base.waiting import wait_until
from bench.harness.triton.io import Stream, cancel_id_of
from gateway_server.engine.sim.config import SimConfig
from gateway_server.siblings import Siblings, home_of
from tests.support.gateway import LONG, MODEL, Gateway, running_api_processes
from tests.support.metrics_files import unreadable_files, write_counter

SIM = SimConfig(step_base_s=0.005)


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[list[Gateway]]:
    async with running_api_processes(tmp_path, 3, sim=SIM) as gateways:
        yield gateways


def id_with_home(home: int, prefix: str) -> str:
    """A request id whose home (of 3 processes) is ``home``."""
    return next(f"{prefix}-{i}" for i in range(1000) if home_of(f"{prefix}-{i}", 3) == home)


async def start_stream(gw: Gateway, rid: str, max_tokens: int = LONG) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream": True}
    resp = await gw.session.post(f"{gw.url}/v1/completions", json=body,
                                 headers={"X-Request-Id": rid})  # fmt: skip
    assert resp.status == 200, await resp.text()
    await resp.content.readline()  # the first token: decoding
    return resp


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    return [line.decode()[6:].strip() async for line in resp.content if line.startswith(b"data: ")]


async def test_an_id_the_gateway_makes_has_its_home_where_the_call_runs(
    three: list[Gateway],
) -> None:
    """A call that came without an id gets one whose home is the process running it: no claim at
    a sibling before it starts; a cancel landing elsewhere takes one hop, to the home that runs
    it."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": LONG, "stream": True}
    for owner, gw in enumerate(three):
        resp = await gw.session.post(f"{gw.url}/v1/completions", json=body)
        assert resp.status == 200, await resp.text()
        await resp.content.readline()  # decoding
        rid = resp.headers["X-Request-Id"]
        assert home_of(rid, 3) == owner, rid
        via = three[(owner + 1) % 3]
        forwarded = via.metric("hangup_gateway_cancel_forward_seconds_count") or 0
        status, answer = await via.cancel(rid, "explicit")
        assert status == 200 and answer["state"] == "cancelled", answer
        assert via.metric("hangup_gateway_cancel_forward_seconds_count") == forwarded + 1
        assert json.loads((await read_events(resp))[-1])["error"]["type"] == "cancelled"


async def test_a_cancel_reaches_its_request_from_every_process(three: list[Gateway]) -> None:
    owner, elsewhere, home = three
    for via, name in ((owner, "owner"), (home, "home"), (elsewhere, "two-hops")):
        rid = id_with_home(2, name)  # runs on process 0, its home is process 2
        resp = await start_stream(owner, rid)
        status, body = await via.cancel(rid, "explicit")
        assert status == 200, (name, body)
        assert body["state"] == "cancelled" and body["phase"] == "decode", name
        assert body["generated_tokens"] >= 1
        assert body["usage"]["prompt_tokens"] == 1, body  # its usage, across the processes
        events = await read_events(resp)
        assert json.loads(events[-1])["error"]["type"] == "cancelled", name
    assert owner.cancellations("explicit", "decode") == 3  # counted once, by the owner
    assert elsewhere.cancellations("explicit", "decode") == 0
    assert home.cancellations("explicit", "decode") == 0
    # Forwarded: "home" asked the owner (1 hop); "two-hops" asked home, which asked the owner.
    assert home.metric("hangup_gateway_cancel_forward_seconds_count") == 2
    assert elsewhere.metric("hangup_gateway_cancel_forward_seconds_count") == 1
    status, body = await elsewhere.cancel(id_with_home(2, "two-hops"))
    assert status == 200 and body["state"] == "finished"  # ended: the home remembers


async def test_an_early_cancel_wins_wherever_the_request_lands(three: list[Gateway]) -> None:
    first, second, third = three
    rid = id_with_home(0, "early")
    status, _ = await third.cancel(rid, "client_disconnect")
    assert status == 404  # never seen: a tombstone at its home
    body = {"model": MODEL, "prompt": "x", "max_tokens": 5}
    async with second.session.post(f"{second.url}/v1/completions", json=body,
                                   headers={"X-Request-Id": rid}) as resp:  # fmt: skip
        assert resp.status == 499, await resp.text()
    assert second.cancellations("client_disconnect", "queued") == 1
    # The tombstone is spent: the id runs the next time, on any process.
    async with first.session.post(f"{first.url}/v1/completions", json=body,
                                  headers={"X-Request-Id": rid}) as resp:  # fmt: skip
        assert resp.status == 200


async def test_an_id_in_flight_on_one_process_is_refused_on_another(three: list[Gateway]) -> None:
    first, second, third = three
    rid = id_with_home(2, "dup")
    resp = await start_stream(first, rid)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 5}
    for other in (second, third):
        async with other.session.post(f"{other.url}/v1/completions", json=body,
                                      headers={"X-Request-Id": rid}) as answer:  # fmt: skip
            assert answer.status == 409, await answer.text()
            assert "already in flight" in await answer.text()
    assert set(await second.in_flight()) == {rid}  # the first request, still running
    await first.cancel(rid)
    await read_events(resp)
    async with second.session.post(f"{second.url}/v1/completions", json=body,
                                   headers={"X-Request-Id": rid}) as answer:  # fmt: skip
        assert answer.status == 200  # ended: free again


async def test_listing_and_metrics_answer_for_every_process(three: list[Gateway]) -> None:
    streams = [await start_stream(gw, f"list-{i}") for i, gw in enumerate(three)]
    for gw in three:
        assert set(await gw.in_flight()) == {"list-0", "list-1", "list-2"}
        async with gw.session.get(gw.url + "/metrics") as resp:
            samples = parse(await resp.text())
        assert total(samples, "hangup_gateway_inflight_requests") == 3
        assert total(samples, "hangup_gateway_worker_up") == 3
        assert total(samples, "hangup_gateway_api_processes") == 3
    for i, gw in enumerate(three):
        await gw.cancel(f"list-{i}")
    for resp in streams:
        await read_events(resp)


async def test_metrics_answer_whatever_state_the_processes_files_are_in(
    three: list[Gateway], tmp_path: Path
) -> None:
    """A process starting has created its metrics file but not sized it; one cut off left a
    file cut short: every scrape still answers, with what can be read (a 500 before)."""
    write_counter(tmp_path, 4242, "hangup_gateway_generated_tokens", 7.0, model=MODEL)
    unreadable_files(tmp_path)
    for gw in three:
        async with gw.session.get(gw.url + "/metrics") as resp:
            assert resp.status == 200, await resp.text()
            samples = parse(await resp.text())
        assert total(samples, "hangup_gateway_generated_tokens_total") == 7.0
        assert total(samples, "hangup_gateway_api_processes") == 3
        async with gw.session.get(gw.url + "/metrics/pool") as resp:
            assert resp.status == 200, await resp.text()
            assert total(parse(await resp.text()), "vllm:num_requests_running") == 0


async def test_one_request_of_a_grpc_stream_is_cancelled_from_another_process(
    three: list[Gateway],
) -> None:
    owner, other, _ = three
    client = triton.InferenceServerClient(owner.server.listeners["grpc"])
    try:
        stream = Stream(client)
        stream.send("long", "keep going", max_tokens=LONG, ignore_eos=True)
        first, _ = await stream.next()
        status, body = await other.cancel(cancel_id_of(first), "explicit")
        assert status == 200 and body["state"] == "cancelled", body
        while True:
            _, error = await stream.next()
            if error is not None:
                break
        assert "CANCELLED" in str(error)
        assert owner.cancellations("explicit", "decode") == 1
        stream.close()
    finally:
        await client.close()


async def test_a_cancel_finds_its_request_while_the_home_is_down(tmp_path: Path) -> None:
    async with running_api_processes(tmp_path, 3, sim=SIM) as (owner, other, home):
        rid = id_with_home(2, "homeless")
        resp = await start_stream(owner, rid)
        assert isinstance(home.server.scope, Siblings)
        await home.server.scope.close()  # its socket is gone: as while it restarts
        status, body = await other.cancel(rid, "explicit")
        assert status == 200 and body["state"] == "cancelled"  # asked every sibling instead
        await read_events(resp)
        await wait_until(lambda: owner.requests("cancelled") == 1, what="counted")
        status, _ = await other.cancel(id_with_home(2, "never-seen"))
        assert status == 404
