"""An edge in front of LiteLLM as it comes, in front of three pods of a server with no cancel API
of its own: Truss's own model server (the Truss tier's ``polling`` model, its
``chat_completions`` asking ``request.is_disconnected()`` between 20 ms steps), each behind a
sidecar (``--cancel-adapter none``, the edge's id trusted, the cancel by id behind a token).

LiteLLM does not pass a hang-up on for a call that does not stream (``cancel_on_disconnect`` is
off by default): the model runs to its end for nobody. With ``--cancel-pool`` naming the three
sidecars, the edge's cancel by id reaches the one that holds the call, which closes its upstream
connection, and the model sees its client gone. Skips, saying why, without LiteLLM
(``.venv-litellm``) or Truss (``.venv-truss``). The same with pods of ``vllm serve`` or of hangup's
gateway: ``bench.front_doors.litellm_edge``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.base.addresses import port_of
from bench.base.processes import Process, spawn
from bench.base.scrape import metric_sum
from bench.base.waiting import wait_until
from bench.harness.front_doors import LITELLM, MODEL, running_front_door
from bench.harness.truss import server as truss_server
from bench.harness.truss.server import TrussServer
from bench.harness.unavailable import Unavailable

pytestmark = pytest.mark.slow

PODS = 3
STEPS = 150  # 3 s of 20 ms steps: what the model runs for nobody without the pool
ENDED_WITHIN_S = 1.5  # the model's disconnect after the client's close, through the pool
TOKEN = "pod-token"


@dataclass
class Edge:
    pods: list[TrussServer]
    sidecars: list[Process]
    litellm: str
    work: Path
    token: Path


@pytest.fixture(scope="module")
def behind_litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    if not LITELLM.exists():
        raise Unavailable(f"no {LITELLM}: `make test` installs LiteLLM there")
    if reason := truss_server.skip_reason():
        raise Unavailable(reason)
    work = tmp_path_factory.mktemp("litellm-edge")
    token = work / "cancel-token"
    token.write_text(TOKEN)
    with contextlib.ExitStack() as stack:
        pods, sidecars = [], []
        for i in range(PODS):
            servers = stack.enter_context(truss_server.running_truss(["polling"], work / f"pod{i}"))
            pods.append(servers["polling"])
            args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                    "--upstream-http", pods[-1].url(), "--cancel-adapter", "none",
                    "--trust-client-request-id", "--cancel-token-file", str(token)]  # fmt: skip
            sidecars.append(stack.enter_context(spawn("proxy", args, work / f"sidecar{i}")))
        ports = [port_of(s.url()) for s in sidecars]
        litellm = stack.enter_context(running_front_door("litellm", work / "litellm", ports))
        yield Edge(pods, sidecars, litellm, work, token)


def started_now(edge: Edge, known: set[str]) -> tuple[TrussServer, str] | None:
    for pod in edge.pods:
        for request_id in pod.ended().keys() - known:
            return pod, request_id
    return None


async def hang_up_once(edge: Edge, front: Process) -> tuple[TrussServer, str, float]:
    """One chat call through the edge, closed by its client once a pod's model has begun it:
    the pod, the call's id there (the edge's) and when the client left."""
    known = {i for pod in edge.pods for i in pod.ended()}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": STEPS, "stream": False}  # fmt: skip
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        call = asyncio.ensure_future(s.post(f"{front.url()}/v1/chat/completions", json=body))
        try:
            found = await wait_until(lambda: started_now(edge, known), 30, "a pod to begin it")
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
        gone = time.time()
    return (*found, gone)


async def ended(pod: TrussServer, request_id: str) -> dict[str, Any]:
    def how() -> dict[str, Any] | None:
        line = pod.ended().get(request_id)
        return line if line and line["how"] != "started" else None

    return await wait_until(how, STEPS * 0.02 + 10, f"{request_id} to end", explain=pod.log)


@pytest.mark.parametrize("pool", [False, True], ids=["edge-alone", "cancel-pool"])
async def test_an_edge_with_a_cancel_pool_ends_hang_ups_on_truss_pods_behind_litellm(
    behind_litellm: Edge, pool: bool
) -> None:
    edge = behind_litellm
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", edge.litellm, "--cancel-token-file", str(edge.token)]  # fmt: skip
    if pool:
        args += ["--cancel-pool", ",".join(s.url() for s in edge.sidecars)]
    name = "pool" if pool else "alone"
    with spawn("proxy", args, edge.work / f"edge-{name}") as front:
        hung_up = [await hang_up_once(edge, front) for _ in range(4)]
        lines = [(await ended(pod, request_id), left) for pod, request_id, left in hung_up]

        def answered(result: str) -> float:
            return metric_sum(front.url("admin"), "hangup_proxy_cancel_calls_total", result=result)

        # every cancel answered: by the pod that held the call (ok) or, alone, by LiteLLM (404)
        await wait_until(lambda: answered("ok") + answered("not_found") >= len(hung_up), 10,
                         "the edge's cancels answered")  # fmt: skip
        asked = answered("ok")
    for (pod, request_id, _), (line, left) in zip(hung_up, lines, strict=True):
        assert len([s for s in pod.seen(request_id) if s["how"] == "started"]) == 1  # no retry
        if pool:
            assert line["how"] == "disconnected", line
            assert line["at"] - left < ENDED_WITHIN_S, (line, left)
        else:  # LiteLLM swallowed the hang-up: the model ran on for nobody
            assert (line["how"], line["step"]) == ("finished", STEPS), line
    assert asked == (len(hung_up) if pool else 0)
