"""``python -m gateway_server --workers 2 --api-processes 2`` behind ``python -m proxy --workers
2``: both scaled, as separate processes on shared ports. Every hang-up is cancelled and counted
once on each side, every token once; cancels sent straight to the gateway land on either
process and reach their request; a hang-up while the id's home has not yet answered leaves the
call in flight nowhere, and a call without an id is not held by a stalled sibling; one scrape
answers for the whole gateway; new connections go to the process holding fewer, and a stalled
process holds none of them; the proxy's gRPC calls reach every process (each one's own port); a
killed API process is started again, on the same own gRPC port, and counted; SIGTERM drains
every API process, and API processes whose supervisor was killed drain and exit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from bench.base.processes import Process, alive, children, environ_of, spawn, stopped
from bench.base.scrape import scrape_async, scraping, total
from bench.base.waiting import wait_until
from bench.harness.grpc_fuzz import INFERENCE, infer_request
from bench.harness.log_records import records
from bench.harness.stack import (
    MODEL,
    TOKEN,
    RawClients,
    Stack,
    completion_request,
    in_flight,
    running_stack,
)
from gateway_server.siblings import home_of
from gateway_server.siblings.processes import SLOT_ENV
from hangup_contract.protos import inference_pb2 as pb
from tests.support.metrics_files import unreadable_files
from tests.support.shared_port import answered_one_by_one, refused

# 32 slots per worker (one per process): a process holds no more connections than the other
# unless that one stalls, but a stream without a slot would never send its first token.
GATEWAY = ["--sim-slots", "32", "--sim-step-base", "0.02", "--workers", "2",
           "--api-processes", "2", "--grpc-process-ports", "0", "--drain-timeout", "1"]  # fmt: skip
LONG = {"model": MODEL, "prompt": "long", "max_tokens": 3000, "stream": True}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path, GATEWAY, ["--workers", "2"]) as stack:
        yield stack


async def _stream(raw: RawClients, url: str, request_id: str | None = None) -> tuple[Any, Any]:
    """A streamed completion, once its first token arrived: (reader, writer)."""
    request = completion_request("/v1/completions", LONG, request_id=request_id)
    reader, writer = await raw.open(url, request)
    async with asyncio.timeout(10):
        while not (await reader.readline()).startswith(b"data: {"):
            pass
    return reader, writer


async def _complete(session: aiohttp.ClientSession, url: str) -> None:
    body = {"model": MODEL, "prompt": "short", "max_tokens": 3}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def _log_lines(stack: Stack, msg: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stack.gateway.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("msg") == msg]


async def _idle(session: aiohttp.ClientSession, stack: Stack) -> bool:
    return not await in_flight(session, stack.gateway_url)


async def test_hang_ups_through_both_scaled_are_cancelled_and_counted_once_each_side(
    stack: Stack, raw: RawClients
) -> None:
    fresh = aiohttp.TCPConnector(force_close=True)  # each call on a new connection
    async with aiohttp.ClientSession(connector=fresh) as session:
        await asyncio.gather(*(_complete(session, stack.proxy_url) for _ in range(60)))
        streams = await asyncio.gather(*(_stream(raw, stack.proxy_url) for _ in range(20)))
        assert len(await in_flight(session, stack.gateway_url)) == 20  # listed by either
        for _, writer in streams:
            writer.close()
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
        gateway = await scrape_async(session, stack.gateway_url)
        proxy = await scrape_async(session, stack.admin_url)
    assert total(gateway, "hangup_gateway_cancellations_total", reason="client_disconnect") == 20
    assert total(gateway, "hangup_gateway_requests_total", outcome="completed") == 60
    assert total(gateway, "hangup_gateway_requests_total", outcome="cancelled") == 20
    assert total(gateway, "hangup_gateway_inflight_requests") == 0
    assert total(gateway, "hangup_gateway_api_processes") == 2
    # every token counted, though each process adds a stream's to its files in batches
    wasted = total(gateway, "hangup_gateway_wasted_tokens_total")
    tokens = total(gateway, "hangup_gateway_generated_tokens_total")
    assert wasted >= 20 and tokens == 60 * 3 + wasted
    assert total(gateway, "hangup_gateway_inter_token_latency_seconds_count") == tokens - 80
    assert total(gateway, "hangup_gateway_time_to_first_token_seconds_count") == 80
    assert total(proxy, "hangup_proxy_requests_total", outcome="cancelled") == 20
    assert total(proxy, "hangup_proxy_cancel_calls_total", result="ok") == 20
    ends = _log_lines(stack, "request_end")
    assert len(ends) == 80 and {line["api_process"] for line in ends} == {0, 1}


async def test_cancels_sent_to_either_process_reach_their_request(
    stack: Stack, raw: RawClients
) -> None:
    fresh = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=fresh) as session:
        ids = [f"direct-{i}" for i in range(24)]
        streams = await asyncio.gather(*(_stream(raw, stack.gateway_url, rid) for rid in ids))
        answers = []
        for rid in ids:  # each on a new connection: the kernel picks the process
            url = f"{stack.gateway_url}/v2/requests/{rid}/cancel"
            async with session.post(url, headers=AUTH) as resp:
                answers.append((resp.status, await resp.json()))
        for _, writer in streams:
            writer.close()
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
        gateway = await scrape_async(session, stack.gateway_url)
    assert all(s == 200 and a["state"] == "cancelled" for s, a in answers), answers
    assert total(gateway, "hangup_gateway_cancellations_total", reason="explicit") == 24
    # 24 cancels over two processes: some landed on the process that did not run their request.
    assert total(gateway, "hangup_gateway_cancel_forward_seconds_count") >= 1


async def _job_stream(raw: RawClients, url: str, *, header: bool) -> asyncio.StreamReader:
    """A streamed completion of job ``rollout-1``, tagged by ``X-Hangup-Group`` or by its body's
    ``metadata.hangup_group`` (read by the gateway only), once its first token arrived."""
    body = LONG | ({} if header else {"metadata": {"hangup_group": "rollout-1"}})
    request = completion_request("/v1/completions", body)
    if header:
        request = request.replace(b"\r\n\r\n", b"\r\nX-Hangup-Group: rollout-1\r\n\r\n", 1)
    reader, _ = await raw.open(url, request)
    async with asyncio.timeout(10):
        while not (await reader.readline()).startswith(b"data: {"):
            pass
    return reader


async def test_a_job_spread_over_both_scaled_ends_with_one_call(
    stack: Stack, raw: RawClients
) -> None:
    """Twelve streams of one job, each on a connection of its own (so over both proxy workers
    and both API processes), half tagged by header, half by body: one group cancel on the
    proxy's port ends them all and answers each; a call of the job that comes after is refused;
    a batch of ids does the same for the ids it names."""
    streams = await asyncio.gather(
        *(_job_stream(raw, stack.proxy_url, header=n % 2 == 0) for n in range(12))
    )
    fresh = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=fresh) as session:
        listed = await in_flight(session, stack.gateway_url)
        assert len(listed) == 12 and {c["group"] for c in listed.values()} == {"rollout-1"}
        async with session.post(f"{stack.proxy_url}/v2/groups/rollout-1/cancel", headers=AUTH) as r:
            status, answer = r.status, await r.json()
        assert status == 200, answer
        assert len(answer["cancelled_request_ids"]) == 12, answer
        assert {e["request_id"] for e in answer["results"]} == set(listed)
        assert all(e["phase"] == "decode" for e in answer["results"])  # the gateway's entries
        for reader in streams:
            async with asyncio.timeout(10):
                rest = await reader.readuntil(b"\r\n0\r\n\r\n")
            assert b"request cancelled (explicit)" in rest and b"[DONE]" not in rest
        late = completion_request("/v1/completions", {"model": MODEL, "prompt": "x",
                                                       "max_tokens": 2})  # fmt: skip
        late = late.replace(b"\r\n\r\n", b"\r\nX-Hangup-Group: rollout-1\r\n\r\n", 1)
        for _ in range(4):  # whichever worker and process it lands on
            reader, writer = await raw.open(stack.proxy_url, late)
            assert (await reader.readline()).startswith(b"HTTP/1.1 499 ")
            writer.close()
        batch_ids = [f"batch-{n}" for n in range(6)]
        batch = await asyncio.gather(*(_stream(raw, stack.proxy_url, i) for i in batch_ids))
        body = {"request_ids": [*batch_ids, "nobody"]}
        async with session.post(
            f"{stack.proxy_url}/v2/requests/cancel", json=body, headers=AUTH
        ) as resp:
            answer = await resp.json()
        assert [(e["request_id"], e["state"]) for e in answer["results"]] == [
            *((i, "cancelled") for i in batch_ids), ("nobody", "not_found")
        ]  # fmt: skip
        for reader, _ in batch:
            async with asyncio.timeout(10):
                await reader.readuntil(b"\r\n0\r\n\r\n")
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
        gateway = await scrape_async(session, stack.gateway_url)
    assert total(gateway, "hangup_gateway_cancellations_total", reason="explicit") == 18


async def test_a_hang_up_while_the_ids_home_answers_leaves_the_call_in_flight_nowhere(
    stack: Stack, raw: RawClients
) -> None:
    """The process that takes a call asks the id's home (stopped here, as a long pause would)
    whether the id is in flight elsewhere, and the client hangs up before the home answers: the
    call is counted cancelled in the queued phase and held nowhere, neither by the process that
    took it nor by the home once it runs again (the id is accepted again). Under load, with new
    connections per call, such calls stayed listed as queued until the drain timed out."""
    slots = {int(environ_of(pid)[SLOT_ENV]): pid for pid in children(stack.gateway.popen.pid)}
    request_id = next(rid for i in itertools.count() if home_of(rid := f"homed-{i}", 2) == 1)
    request = completion_request("/v1/completions", LONG, request_id=request_id)
    with stopped(slots[1]):  # process 0 takes the connection and waits for the home (5 s at most)
        _, writer = await raw.open(stack.gateway_url, request)
        # Nothing outside the processes shows the claim waiting; 1 s is far more than process 0
        # needs to take the call and ask, and far less than the 5 s it waits for the home.
        await asyncio.sleep(1.0)
        writer.close()

        def ended() -> bool:  # the hang-up handled while the home is still stopped
            return any(
                line["request_id"] == request_id for line in _log_lines(stack, "request_end")
            )

        await wait_until(ended, what="the call's end logged")
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
        gateway = await scrape_async(session, stack.gateway_url)
        body = {"model": MODEL, "prompt": "short", "max_tokens": 3}
        headers = {"X-Request-Id": request_id}
        async with session.post(
            stack.gateway_url + "/v1/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
    assert total(gateway, "hangup_gateway_cancellations_total", phase="queued") == 1
    assert total(gateway, "hangup_gateway_cancellations_total", reason="client_disconnect") == 1
    assert total(gateway, "hangup_gateway_requests_total", outcome="cancelled") == 1


async def test_new_connections_go_to_the_process_holding_fewer(
    stack: Stack, raw: RawClients
) -> None:
    streams = [await _stream(raw, stack.gateway_url) for _ in range(16)]  # opened one by one
    for _, writer in streams:
        writer.close()
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
    held = Counter(line["api_process"] for line in _log_lines(stack, "request_end"))
    # 8 each unless one process was slow to take its turn (then the other took it): the kernel's
    # hash (SO_REUSEPORT) gave one process 11 or more of 16 in one run of four.
    assert sorted(held) == [0, 1] and max(held.values()) <= 10, held


async def test_a_stalled_api_process_holds_no_new_connection(stack: Stack) -> None:
    """As a long pause would: the other process takes every new connection, within a moment."""
    with stopped(children(stack.gateway.popen.pid)[0]):
        seen = await answered_one_by_one(stack.gateway_url + "/v2/health/ready", 16, within=5.0)
    assert seen == [200] * 16  # with SO_REUSEPORT about half waited for the stalled process


async def test_calls_without_an_id_are_not_held_by_a_stalled_sibling(stack: Stack) -> None:
    """The id the gateway makes for a call has its home where the call runs: no claim waits on
    a sibling (one that stalls would hold it for the claim's 5 s timeout)."""
    body = {"model": MODEL, "prompt": "short", "max_tokens": 3}
    fresh = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=2.5)
    async with aiohttp.ClientSession(connector=fresh, timeout=timeout) as session:
        with stopped(children(stack.gateway.popen.pid)[0]):
            for _ in range(8):
                async with session.post(stack.gateway_url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()


async def _grpc_calls(stack: Stack, count: int) -> Counter[int]:
    """``count`` unary gRPC calls through the proxy, 8 at a time: which API process ran each."""
    before = len(_log_lines(stack, "request_end"))
    async with grpc.aio.insecure_channel(stack.proxy.listeners["grpc"]) as channel:
        infer = channel.unary_unary(
            INFERENCE + "ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        for first in range(0, count, 8):
            batch = range(first, min(count, first + 8))
            await asyncio.gather(*(infer(infer_request(stream=False), timeout=10) for _ in batch))

    def ended() -> list[dict[str, Any]]:  # each call's line is written as it ends, after its answer
        lines = _log_lines(stack, "request_end")[before:]
        return lines if len(lines) >= count else []

    lines = await wait_until(ended, what=f"{count} request_end lines")
    return Counter(line["api_process"] for line in lines)


async def test_grpc_calls_through_the_proxy_reach_every_api_process(stack: Stack) -> None:
    """The proxy's one gRPC connection to the shared port would carry every call to the one
    process that accepted it; given each process's own port it spreads its calls over them."""
    assert len(stack.gateway.listeners["grpc_processes"].split(",")) == 2
    served = await _grpc_calls(stack, 40)
    assert sorted(served) == [0, 1], served
    assert min(served.values()) >= 15, served  # taken in turn: 20 each, bar the first few


async def test_a_killed_api_process_is_started_again_and_counted(
    stack: Stack, raw: RawClients
) -> None:
    fresh = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=fresh) as session:
        streams = await asyncio.gather(*(_stream(raw, stack.gateway_url) for _ in range(8)))
        victim = children(stack.gateway.popen.pid)[0]
        slot = int(environ_of(victim)[SLOT_ENV])
        pages = (stack.gateway_url + "/metrics", stack.gateway_url + "/metrics/pool")
        async with scraping(session, *pages) as scrapes:  # as Prometheus and the EPP do
            os.kill(victim, signal.SIGKILL)
            await wait_until(lambda: _restarted(session, stack), what="the process started again")
        # Every scrape while the process died and started again answered, whole (one the killed
        # process had accepted is cut, as any call to it is; none waiting to be accepted is).
        assert not scrapes.failed and scrapes.answered >= 2, scrapes
        for _, writer in streams:
            writer.close()
        await wait_until(lambda: _idle(session, stack), what="nothing in flight on the gateway")
        await asyncio.gather(*(_complete(session, stack.proxy_url) for _ in range(20)))
        async with session.get(stack.gateway_url + "/v2/health/ready") as resp:
            assert resp.status == 200
    # It serves gRPC on its own port again (the supervisor kept it), and the proxy uses it again.

    async def reached() -> bool:
        return slot in await _grpc_calls(stack, 4)

    await wait_until(reached, within=20, what=f"a gRPC call through the proxy on process {slot}")
    exited = [json.loads(line) for line in stack.gateway.log().splitlines()
              if "API process exited" in line]  # fmt: skip
    assert len(exited) == 1 and exited[0]["pid"] == victim and exited[0]["exit"] == -9


async def test_metrics_files_a_scrape_cannot_read_are_skipped_and_counted(stack: Stack) -> None:
    """Files as a process starting or cut off leaves them, in the real run directory: every
    scrape answers, and says how many files it skipped."""
    api_process = children(stack.gateway.popen.pid)[0]
    unreadable_files(Path(environ_of(api_process)["PROMETHEUS_MULTIPROC_DIR"]))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:

        async def counted() -> bool:
            samples = await scrape_async(session, stack.gateway_url)  # 200, parsed
            return total(samples, "hangup_gateway_metrics_files_skipped_total") >= 2

        await wait_until(counted, what="the skipped files counted")


async def _restarted(session: aiohttp.ClientSession, stack: Stack) -> bool:
    samples = await scrape_async(session, stack.gateway_url)
    return (
        total(samples, "hangup_gateway_api_process_restarts_total") == 1
        and total(samples, "hangup_gateway_api_processes") == 2
    )


async def test_sigterm_drains_every_api_process(stack: Stack, raw: RawClients) -> None:
    streams = await asyncio.gather(*(_stream(raw, stack.gateway_url) for _ in range(6)))
    processes = children(stack.gateway.popen.pid)
    assert len(processes) == 2
    stack.gateway.popen.terminate()
    # While the processes drain, a new connection is refused, not queued for nobody.
    await wait_until(lambda: refused(stack.gateway.listeners["http"]), what="refused")
    assert alive(processes), "refused only once every API process had exited"
    assert await asyncio.to_thread(stack.gateway.popen.wait, 30) == 0
    for reader, writer in streams:
        assert b"[DONE]" not in await reader.read()  # ended, told, not left hanging
        writer.close()
    ends = _log_lines(stack, "request_end")
    assert sum(line["reason"] == "shutdown" for line in ends) == 6
    assert not alive(processes)
    # Every line of the stop is a JSON log record, as a log pipeline expects: no traceback of a
    # sibling connection cancelled on the way out (Python 3.11's streams log one).
    assert records(stack.gateway.log())


async def test_api_processes_drain_and_exit_when_their_supervisor_is_killed(
    stack: Stack, raw: RawClients
) -> None:
    streams = await asyncio.gather(*(_stream(raw, stack.gateway_url) for _ in range(4)))
    processes = children(stack.gateway.popen.pid)
    assert len(processes) == 2
    stack.gateway.popen.kill()  # as the OOM killer would
    stack.gateway.popen.wait()
    await wait_until(lambda: not alive(processes), within=15, what="the API processes exited")
    for reader, writer in streams:
        assert b"[DONE]" not in await reader.read()  # ended by the drain, not left hanging
        writer.close()
    assert len(_log_lines(stack, "supervisor gone: draining")) == 2


@pytest.fixture
def gateway_pair(tmp_path: Path) -> Iterator[Process]:
    """The gateway alone, two API processes on its shared ports."""
    args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", "--workers", "2",
            "--api-processes", "2", "--sim-step-base", "0.005"]  # fmt: skip
    with spawn("gateway_server", args, tmp_path) as process:
        yield process
        process.terminate()


async def test_a_response_is_found_whichever_api_process_a_request_lands_on(
    gateway_pair: Process,
) -> None:
    """A response made on one process, then read, continued, followed and deleted on new
    connections: a process holding an open connection takes no new one while the other holds
    none, so the tries land on the process that did not make it (the log says where each call
    ran). Was: GET, previous_response_id, a resumed stream and DELETE answered 404 there. Not
    every try: the home process takes a waiting connection itself once the idle one has left
    it ``PATIENCE_S`` (2 ms; one pass of its event loop can be longer), so one of the four
    follow-ups landed at home in 2 of 12 runs here; every try's answer is checked either way."""
    url = gateway_pair.url() + "/v1/responses"
    body = {"model": MODEL, "input": "x", "max_output_tokens": 5}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as maker,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as other,
    ):
        async with maker.post(url, json=body, headers={"X-Request-Id": "made"}) as resp:
            made = await resp.json()
            assert resp.status == 200, made
        background = body | {"max_output_tokens": 200, "background": True}
        async with maker.post(url, json=background) as resp:
            followed = (await resp.json())["id"]  # made where the first was: maker's connection
        tries = []
        for n in range(4):
            async with other.get(f"{url}/{made['id']}") as resp:
                tries.append((resp.status, (await resp.json()).get("output")))
            follow_up = body | {"previous_response_id": made["id"]}
            async with other.post(url, json=follow_up, headers={"X-Request-Id": f"next-{n}"}) as r:
                tries.append((r.status, None))
        async with other.get(f"{url}/{followed}?stream=true") as resp:
            assert resp.status == 200, await resp.text()
            events = (await resp.read()).split(b"\n\n")[:-1]
        async with maker.get(f"{url}/{followed}?stream=true") as resp:
            replayed = (await resp.read()).split(b"\n\n")[:-1]
        async with other.delete(f"{url}/{made['id']}") as resp:
            deleted = resp.status
        gone = []
        for session in (maker, other):
            async with session.get(f"{url}/{made['id']}") as resp:
                gone.append(resp.status)
    assert tries == [(200, made["output"]), (200, None)] * 4
    assert events == replayed and b"response.incomplete" in events[-1]
    assert (deleted, gone) == (200, [404, 404])
    ran = {  # an engine request's id: its call's and the choice's index
        line["request_id"].rpartition("-")[0]: line["api_process"]
        for line in _log_lines_of(gateway_pair)
    }
    assert 1 - ran["made"] in {ran[f"next-{n}"] for n in range(4)}, ran


def _log_lines_of(process: Process) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in process.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("msg") == "request_end"]
