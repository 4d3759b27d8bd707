"""Truss's own model server (truss 0.18.36), straight and behind the sidecar.

Truss has no cancel API: its models stop a long prediction by asking
``request.is_disconnected()``, which turns true once the connection to the server is gone. So
the sidecar in front of Truss runs with ``--cancel-adapter none`` (a hang-up closes the upstream
connection; no cancel call), and what these tests check is what each kind of model sees:

- ``polling`` (an async ``predict`` asking between 20 ms steps) and ``polling_stream`` (a
  generator asking between chunks) see every hang-up within a step or two of it, through the
  sidecar as straight;
- ``watcher_sync`` (a sync ``predict`` reading the event of Truss's disconnect watcher) sees it
  within the watcher's once-a-second poll;
- ``ignoring_stream`` (a generator that never asks) runs to its end whatever happens, holding
  Truss's one ``predict_concurrency`` slot: the next request waits behind a call nobody reads.
  What no proxy can change: the model has to ask.

The sidecar's own cancel by id (``POST /v2/requests/{id}/cancel``, its token) ends a Truss call
the same way: the polling model sees its connection gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest

from bench.base.addresses import host_port
from bench.base.scrape import metric_sum
from bench.base.waiting import wait_until
from bench.harness.truss.server import TrussServer
from tests.truss.conftest import TOKEN, Pod

STEPS = 500  # 10 s of 20 ms steps: what a hang-up must cut short
POLLED_S = 1.0  # a polling model sees a hang-up within this (a step is 20 ms)
WATCHED_S = 2.5  # the sync model within this (Truss's watcher polls once a second)
PATH = "/v1/models/model:predict"


def address(url: str) -> tuple[str, int]:
    host, port = host_port(url)
    return host, port


async def open_call(
    url: str, body: dict[str, Any], request_id: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A predict call on a connection of its own, written whole (the answer not read)."""
    reader, writer = await asyncio.open_connection(*address(url))
    payload = json.dumps(body).encode()
    head = (f"POST {PATH} HTTP/1.1\r\nHost: truss\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n")  # fmt: skip
    if request_id is not None:
        head += f"X-Request-Id: {request_id}\r\n"
    writer.write(head.encode() + b"\r\n" + payload)
    await writer.drain()
    return reader, writer


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> None:
    seen = b""
    while marker not in seen:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, f"the stream ended before {marker!r}: {seen[-200:]!r}"
        seen += chunk


async def started(server: TrussServer, request_id: str) -> None:
    await wait_until(lambda: request_id in server.ended(), 10, f"{request_id} started",
                     explain=server.log)  # fmt: skip


async def hang_up(server: TrussServer, url: str, stream: bool) -> tuple[str, float]:
    """One call, hung up once the model has begun it (a stream: after its third chunk); its id
    (its ``X-Request-Id`` too, which the sidecars trust) and when its client left (epoch seconds,
    as the model records)."""
    request_id = uuid.uuid4().hex
    reader, writer = await open_call(url, {"id": request_id, "steps": STEPS}, request_id)
    if stream:
        await read_until(reader, f"{request_id} 2\n".encode())
    else:
        await started(server, request_id)
    writer.close()
    gone = time.time()
    await writer.wait_closed()
    return request_id, gone


async def ended(server: TrussServer, request_id: str) -> dict[str, Any]:
    def how() -> dict[str, Any] | None:
        line = server.ended().get(request_id)
        return line if line and line["how"] != "started" else None

    return await wait_until(how, STEPS * 0.02 + 10, f"{request_id} to end", explain=server.log)


def target(pod: Pod, via: str) -> str:
    return pod.server.url() if via == "direct" else pod.sidecars["none"].url()


@pytest.mark.parametrize("at_once", [1, 16])
@pytest.mark.parametrize("via", ["direct", "sidecar"])
@pytest.mark.parametrize("model", ["polling", "polling_stream", "watcher_sync"])
async def test_a_model_that_asks_sees_every_hang_up_through_the_sidecar_as_straight(
    truss_pods: dict[str, Pod], model: str, via: str, at_once: int
) -> None:
    pod = truss_pods[model]
    stream = model == "polling_stream"
    admin = pod.sidecars["none"].url("admin")
    cancelled_before = metric_sum(admin, "hangup_proxy_requests_total", outcome="cancelled")
    calls_before = metric_sum(admin, "hangup_proxy_cancel_calls_total")
    gone = await asyncio.gather(
        *(hang_up(pod.server, target(pod, via), stream) for _ in range(at_once))
    )
    within = WATCHED_S if model == "watcher_sync" else POLLED_S
    for request_id, left in gone:
        line = await ended(pod.server, request_id)
        assert line["how"] == "disconnected", line
        assert line["step"] < STEPS, line
        assert line["at"] - left < within, (line, left)
    if via == "sidecar":

        def cancelled() -> float:
            counted = metric_sum(admin, "hangup_proxy_requests_total", outcome="cancelled")
            return counted - cancelled_before

        await wait_until(lambda: cancelled() >= at_once, 10, "the sidecar's count")
        assert cancelled() == at_once
        # ``none``: nothing but the closed connection reaches Truss
        assert metric_sum(admin, "hangup_proxy_cancel_calls_total") == calls_before
        log = pod.server.log()
        assert not [i for i, _ in gone if f"/v2/requests/{i}/cancel" in log]


@pytest.mark.parametrize("via", ["direct", "sidecar"])
async def test_a_model_that_never_asks_runs_on_and_the_next_call_waits_behind_it(
    truss_pods: dict[str, Pod], via: str
) -> None:
    """The baseline: a hang-up mid-stream stops nothing (straight or not), and the model's one
    slot (``predict_concurrency: 1``, Truss's default) stays taken until the generator ends."""
    pod = truss_pods["ignoring_stream"]
    url = target(pod, via)
    steps = 50  # 1 s
    first = uuid.uuid4().hex
    reader, writer = await open_call(url, {"id": first, "steps": steps})
    await read_until(reader, f"{first} 2\n".encode())
    writer.close()
    await writer.wait_closed()
    second = uuid.uuid4().hex
    reader, writer = await open_call(url, {"id": second, "steps": 3})
    await read_until(reader, f"{second} 2\n".encode())
    writer.close()
    await writer.wait_closed()
    first_line = await ended(pod.server, first)
    assert (first_line["how"], first_line["step"]) == ("finished", steps), first_line
    second_start = pod.server.seen(second)[0]
    assert second_start["at"] >= first_line["at"], (first_line, second_start)


async def test_the_default_adapter_sends_truss_a_cancel_call_it_cannot_answer(
    truss_pods: dict[str, Pod],
) -> None:
    """Why the sidecar runs with ``--cancel-adapter none`` in front of Truss: the default
    (``hangup``) follows each hang-up with ``POST /v2/requests/{id}/cancel``, which Truss answers
    404; the model sees the hang-up either way (the closed connection)."""
    pod = truss_pods["polling"]
    admin = pod.sidecars["hangup"].url("admin")
    before = metric_sum(admin, "hangup_proxy_cancel_calls_total", result="not_found")
    request_id, _ = await hang_up(pod.server, pod.sidecars["hangup"].url(), stream=False)
    assert (await ended(pod.server, request_id))["how"] == "disconnected"
    await wait_until(
        lambda: metric_sum(admin, "hangup_proxy_cancel_calls_total", result="not_found") > before,
        10, "the cancel call's 404",
    )  # fmt: skip
    assert f"POST /v2/requests/{request_id}/cancel HTTP/1.1 404" in pod.server.log()


@pytest.mark.parametrize("model", ["polling", "polling_stream"])
async def test_a_cancel_by_id_on_the_sidecar_ends_a_truss_call(
    truss_pods: dict[str, Pod], model: str
) -> None:
    """An operator's (or an edge's) cancel by id on the sidecar: the model sees its connection
    gone, as after a hang-up; the client of a call not yet answered gets 499, a stream is cut."""
    pod = truss_pods[model]
    sidecar = pod.sidecars["none"]
    request_id = uuid.uuid4().hex
    reader, writer = await open_call(sidecar.url(), {"id": request_id, "steps": STEPS}, request_id)
    stream = model == "polling_stream"
    if stream:
        await read_until(reader, f"{request_id} 2\n".encode())
    else:
        await started(pod.server, request_id)
    async with aiohttp.ClientSession() as session:
        cancel = f"{sidecar.url()}/v2/requests/{request_id}/cancel"
        async with session.post(cancel) as refused:
            assert refused.status == 401  # no token: nobody else's call to end
        asked = time.time()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.post(cancel, headers=headers) as answer:
            assert (answer.status, await answer.json()) == (
                200, {"request_id": request_id, "state": "cancelled"}
            )  # fmt: skip
    line = await ended(pod.server, request_id)
    assert line["how"] == "disconnected", line
    assert line["at"] - asked < POLLED_S, (line, asked)
    if not stream:
        status = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        assert status.startswith(b"HTTP/1.1 499 "), status
    else:
        await asyncio.wait_for(reader.read(), 10)  # the stream is cut: the connection ends
    with contextlib.suppress(ConnectionError):
        writer.close()
        await writer.wait_closed()


async def test_vllm_pr_55521_paths_and_a_group_cancel_on_the_sidecar_end_truss_calls(
    truss_pods: dict[str, Pod],
) -> None:
    """A client written for vLLM PR 55521 in front of Truss (which has none of its paths): the
    sidecar answers them itself, with its token. ``POST /v1/requests/{id}/cancel`` ends one
    call, one group cancel a job's two (``X-Hangup-Group``); the polling model sees each
    connection gone; a batch naming them all after answers ``finished``."""
    pod = truss_pods["polling"]
    sidecar = pod.sidecars["none"]
    one, job = uuid.uuid4().hex, [uuid.uuid4().hex, uuid.uuid4().hex]
    group = "job-" + uuid.uuid4().hex
    calls = [await open_call(sidecar.url(), {"id": one, "steps": STEPS}, one)]
    for request_id in job:
        reader, writer = await asyncio.open_connection(*address(sidecar.url()))
        payload = json.dumps({"id": request_id, "steps": STEPS}).encode()
        writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: truss\r\nContent-Type: application/json\r\n"
            f"X-Hangup-Group: {group}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        calls.append((reader, writer))
    for request_id in (one, *job):
        await started(pod.server, request_id)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        cancel = f"{sidecar.url()}/v1/requests/{one}/cancel"
        async with session.post(cancel) as refused:
            assert refused.status == 401
        asked = time.time()
        async with session.post(cancel, headers=headers) as answer:
            assert (answer.status, await answer.json()) == (
                200, {"status": "cancelled", "request_id": one, "state": "cancelled"}
            )  # fmt: skip
        async with session.post(f"{sidecar.url()}/v2/groups/{group}/cancel", headers=headers) as r:
            assert len((await r.json())["cancelled_request_ids"]) == 2
        for request_id in (one, *job):
            line = await ended(pod.server, request_id)
            assert line["how"] == "disconnected" and line["at"] - asked < 2 * POLLED_S, line
        body = {"request_ids": [one]}
        async with session.post(
            f"{sidecar.url()}/v1/requests/cancel", json=body, headers=headers
        ) as r:
            assert (await r.json())["results"] == [{"request_id": one, "state": "finished"}]
    for reader, writer in calls:
        status = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        assert status.startswith(b"HTTP/1.1 499 "), status
        with contextlib.suppress(ConnectionError):
            writer.close()
            await writer.wait_closed()
