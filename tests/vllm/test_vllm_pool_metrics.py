"""The Endpoint Picker's gauges with the real engine, checked against vLLM's own exporter:
``vllm serve`` with the same engine arguments exports ``vllm:num_requests_waiting``/``running``,
``vllm:kv_cache_usage_perc`` and ``vllm:cache_config_info``; the gateway's have the same names,
types and label names (``cache_config_info``'s a subset: the two the EPP reads, and
``engine``), one series each for its two workers, ``num_gpu_blocks`` both engines' blocks. Under
load they follow what the gateway lists in ``GET /v2/requests``, and go back to zero after.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.base.processes import Process
from bench.base.waiting import wait_until
from bench.harness.vllm_stack import IGNORE_EOS, MODEL
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

PROTOCOL = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info")  # fmt: skip
SEQS = 8  # --max-num-seqs of ENGINE_ARGS: a ninth request on a worker waits
Series = dict[str, tuple[str, list[dict[str, str]], list[float]]]


@pytest.fixture(scope="module")
def served(vllm_serve_fronts: serve_fronts.Served) -> str:
    """vLLM's own server (the tier's shared one: what it exports does not depend on its dev
    mode or request log)."""
    return vllm_serve_fronts.url


async def protocol(session: aiohttp.ClientSession, url: str) -> Series:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    families = [f for f in text_string_to_metric_families(text) if f.name in PROTOCOL]
    return {
        f.name: (f.type, [s.labels for s in f.samples], [s.value for s in f.samples])
        for f in families
    }


async def test_names_types_and_labels_are_vllms(served: str, gateway: Process) -> None:
    async with aiohttp.ClientSession() as session:
        theirs = await protocol(session, served)
        ours = await protocol(session, gateway.url())
    assert set(theirs) == set(PROTOCOL)  # what this vLLM exports (the names are not from memory)
    assert set(ours) == set(PROTOCOL)
    for name in PROTOCOL:
        assert ours[name][0] == theirs[name][0] == "gauge", name
        assert len(ours[name][1]) == 1, name  # one series: the pod is one endpoint
        if name == "vllm:cache_config_info":
            assert set(ours[name][1][0]) <= set(theirs[name][1][0])
        else:
            assert set(ours[name][1][0]) == set(theirs[name][1][0]) == {"model_name", "engine"}
    info, their_info = ours["vllm:cache_config_info"][1][0], theirs["vllm:cache_config_info"][1][0]
    assert info["block_size"] == their_info["block_size"]
    assert int(info["num_gpu_blocks"]) == 2 * int(their_info["num_gpu_blocks"])  # two engines


async def _stream(session: aiohttp.ClientSession, url: str, rid: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "stream": True,
            **IGNORE_EOS}  # fmt: skip
    async with session.post(url + "/v1/completions", json=body,
                            headers={"X-Request-Id": rid}) as resp:  # fmt: skip
        assert resp.status == 200, await resp.text()
        async for _ in resp.content:
            pass


async def test_the_gauges_follow_the_engines_load(gateway: Process) -> None:
    url = gateway.url()
    count = 2 * SEQS + 4  # both batches full, four waiting
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = [asyncio.create_task(_stream(session, url, f"pool-{i}")) for i in range(count)]

        async def loaded() -> bool:
            now = await protocol(session, url)
            async with session.get(url + "/v2/requests") as resp:
                listed = len((await resp.json())["requests"])
            running = now["vllm:num_requests_running"][2][0]
            waiting = now["vllm:num_requests_waiting"][2][0]
            return listed == count and (running, waiting) == (2 * SEQS, 4)

        await wait_until(loaded, within=60, what="16 running and 4 waiting, as listed")
        usage = (await protocol(session, url))["vllm:kv_cache_usage_perc"][2][0]
        assert 0 < usage <= 1
        for i in range(count):
            async with session.post(f"{url}/v2/requests/pool-{i}/cancel") as resp:
                assert resp.status == 200
        await asyncio.gather(*streams)

        async def idle() -> bool:
            now = await protocol(session, url)
            return all(now[name][2] == [0] for name in PROTOCOL[:3])

        await wait_until(idle, within=30, what="nothing running or waiting, the cache empty")
