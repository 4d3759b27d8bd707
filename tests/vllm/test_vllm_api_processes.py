"""Real vLLM in two API processes (``--workers 2 --api-processes 2``: one engine each) behind the
proxy with two workers: an API process killed with SIGKILL takes its engine processes down with
it (they ignore SIGTERM, and would keep their memory beside the new engines) and comes back with
new ones; the gateway serves through both processes again.

Not here yet: hang-ups and explicit cancels through this stack on the real engine. A test of
them (40 mixed calls, half hanging up) failed 3 runs of 5: some explicit cancels were answered
after seconds or not within the proxy's 10 s deadline, and two requests ran 16 s past their
hang-up, while the same test with one API process passed 3 of 3 (issue 11's notes). Those runs
started API processes in sessions of their own (since fixed), suspected of the delays. The
simulated engine's tests of the contract across processes pass
(``multi_process/test_gateway_api_processes.py``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.processes import Process, alive, children, descendants, spawn
from tests.support.scrape import parse, total
from tests.support.vllm_stack import MODEL, requires_vllm, vllm_gateway
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.fixture(scope="module")
def scaled(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Process, Process]]:
    tmp = tmp_path_factory.mktemp("vllm-api-processes")
    with vllm_gateway(tiny_model, tmp / "gateway", workers=2, api_processes=2) as gateway:
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", gateway.url(), "--trust-client-request-id",
                "--workers", "2"]  # fmt: skip
        with spawn("proxy", args, tmp / "proxy") as proxy:
            yield gateway, proxy
            proxy.terminate()


async def test_a_killed_api_process_takes_its_engines_down_and_comes_back(
    scaled: tuple[Process, Process],
) -> None:
    gateway, proxy = scaled
    victim = children(gateway.popen.pid)[0]
    engines = descendants(victim)
    assert engines  # its vLLM engine core (and the engine core's worker)
    os.kill(victim, signal.SIGKILL)
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: _restarted(session, gateway.url()), within=300,
                         what="the API process started again, with its engine")  # fmt: skip
        # Orphaned engine processes ignore SIGTERM and would hold their (GPU) memory beside the
        # new process's engines: the supervisor killed what was left of the process group.
        assert not alive(engines)
        body = {"model": MODEL, "prompt": "again", "max_tokens": 8}
        for _ in range(8):  # new connections: the kernel uses both processes again
            async with session.post(proxy.url() + "/v1/completions", json=body,
                                    headers={"Connection": "close"}) as resp:  # fmt: skip
                assert resp.status == 200, await resp.text()
        async with session.get(gateway.url() + "/v2/requests") as resp:
            assert (await resp.json())["requests"] == []  # every call ended, listed by both


async def _restarted(session: aiohttp.ClientSession, gateway: str) -> bool:
    async with session.get(gateway + "/metrics") as resp:
        samples = parse(await resp.text())
    return (
        total(samples, "hangup_gateway_api_process_restarts_total") == 1
        and total(samples, "hangup_gateway_api_processes") == 2
        and total(samples, "hangup_gateway_worker_up") == 2
    )
