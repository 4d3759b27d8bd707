"""The model-server metrics protocol an Endpoint Picker reads (``gateway_server.metrics.pool``):
``vllm:num_requests_waiting``/``running``, ``vllm:kv_cache_usage_perc`` and
``vllm:cache_config_info`` follow the gateway's real load, one series each for the whole pod
(every worker of every API process), with the types and labels vLLM's exporter gives them.
Checked against vLLM's own exporter: ``tests/vllm/test_vllm_pool_metrics.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from gateway_server.engine.sim.config import SIM_BLOCK_SIZE, SimConfig
from proxy.calls.lifecycle import CALL_LOGGER
from proxy.server import Server
from tests.support.gateway import LONG, MODEL, Gateway, running_api_processes, running_gateway
from tests.support.proxy_harness import http_url, metric, running_proxy

# Two slots a worker: a third request on a worker waits.
SIM = SimConfig(slots=2, step_base_s=0.005)
BLOCKS = SIM.slots * SIM.max_model_len // SIM_BLOCK_SIZE  # one worker's
PROTOCOL = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info")  # fmt: skip


async def protocol(
    gw: Gateway, path: str = "/metrics"
) -> dict[str, tuple[str, dict[str, str], float]]:
    """The protocol's families as an EPP parses them: type, labels and value of each; exactly
    one series per name (the EPP keeps only one). ``/metrics/pool`` has nothing else."""
    async with gw.session.get(gw.url + path) as resp:
        assert resp.status == 200
        text = await resp.text()
    found = {}
    for family in text_string_to_metric_families(text):
        assert path == "/metrics" or family.name in PROTOCOL, family.name
        if family.name in PROTOCOL:
            assert len(family.samples) == 1, family
            sample = family.samples[0]
            found[family.name] = (family.type, sample.labels, sample.value)
    return found


async def stream(gw: Gateway, rid: str) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "prompt": "one two three", "max_tokens": LONG, "stream": True}
    resp = await gw.session.post(f"{gw.url}/v1/completions", json=body,
                                 headers={"X-Request-Id": rid})  # fmt: skip
    assert resp.status == 200, await resp.text()
    return resp


async def queued_and_running(gw: Gateway) -> tuple[int, int]:
    phases = [call["phase"] for call in (await gw.in_flight()).values()]
    return sum(p == "queued" for p in phases), sum(p in ("prefill", "decode") for p in phases)


@pytest.fixture
async def two_workers() -> AsyncIterator[Gateway]:
    async with running_gateway(sim=SIM, workers=2) as gw:
        yield gw


async def test_the_gauges_follow_the_pods_load_as_one_endpoint(two_workers: Gateway) -> None:
    gw = two_workers
    idle = await protocol(gw)
    assert set(idle) == set(PROTOCOL)
    for name in PROTOCOL:
        assert idle[name][0] == "gauge", name
    assert idle["vllm:num_requests_running"][1] == {"model_name": MODEL, "engine": "0"}
    assert idle["vllm:num_requests_running"][2] == 0
    assert idle["vllm:kv_cache_usage_perc"][2] == 0
    info = idle["vllm:cache_config_info"]
    assert info[2] == 1 and info[1]["block_size"] == str(SIM_BLOCK_SIZE)
    assert info[1]["num_gpu_blocks"] == str(2 * BLOCKS)  # both workers' caches as one

    assert await protocol(gw, "/metrics/pool") == idle  # the EPP's cheap path: the same

    streams = [await stream(gw, f"load-{i}") for i in range(5)]  # 4 slots in all: one waits
    await wait_until(lambda: _is(gw, running=4, waiting=1), what="4 running and 1 waiting")
    assert await _is(gw, running=4, waiting=1, path="/metrics/pool")
    assert await queued_and_running(gw) == (1, 4)  # what the gateway lists agrees
    busy = await protocol(gw)
    per_worker = [gw.metric("hangup_gateway_engine_kv_cache_usage_ratio", worker=w)
                  for w in ("0", "1")]  # fmt: skip
    assert 0 < busy["vllm:kv_cache_usage_perc"][2] <= max(per_worker)
    for i in range(5):
        status, body = await gw.cancel(f"load-{i}")
        assert status == 200 and body["state"] == "cancelled"
    for resp in streams:
        resp.close()
    await wait_until(lambda: _is(gw, running=0, waiting=0), what="nothing running or waiting")
    assert (await protocol(gw))["vllm:kv_cache_usage_perc"][2] == 0


async def _is(gw: Gateway, *, running: int, waiting: int, path: str = "/metrics") -> bool:
    now = await protocol(gw, path)
    return (now["vllm:num_requests_running"][2], now["vllm:num_requests_waiting"][2]) == (
        running, waiting,
    )  # fmt: skip


async def test_one_scrape_of_any_api_process_reads_the_whole_pod(tmp_path: Path) -> None:
    async with running_api_processes(tmp_path, 3, sim=SIM) as three:
        first, second, third = three
        streams = [await stream(first, f"a-{i}") for i in range(3)]  # 2 run, 1 waits
        streams += [await stream(second, f"b-{i}") for i in range(1)]
        for gw in three:  # the same answer wherever the EPP's scrape lands
            for path in ("/metrics", "/metrics/pool"):
                await wait_until(lambda gw=gw, path=path: _is(gw, running=3, waiting=1, path=path),
                                 what="3 running and 1 waiting, from every process")  # fmt: skip
        pool = (await protocol(second, "/metrics/pool"))["vllm:cache_config_info"][1]
        assert pool["num_gpu_blocks"] == str(3 * BLOCKS)
        info = (await protocol(third))["vllm:cache_config_info"][1]
        assert info["num_gpu_blocks"] == str(3 * BLOCKS)
        usage = (await protocol(third))["vllm:kv_cache_usage_perc"][2]
        samples = await scrape_async(third.session, third.url)  # every worker's, summed
        mean = total(samples, "hangup_gateway_engine_kv_cache_usage_ratio") / 3
        assert usage > 0 and usage == pytest.approx(mean, rel=0.2)  # moving: scraped apart
        for prefix, count in (("a", 3), ("b", 1)):
            for i in range(count):
                status, _ = await third.cancel(f"{prefix}-{i}")
                assert status == 200
        for resp in streams:
            resp.close()
        await wait_until(lambda: _is(first, running=0, waiting=0), what="the pod idle")


async def test_the_proxy_relays_scrapes_on_the_pools_target_port(
    two_workers: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The EPP scrapes the InferencePool's target port, the proxy's HTTP port, every 50 ms:
    the proxy relays ``/metrics`` there without making each scrape a call (no log line, no call
    metrics); it counts them apart."""
    async with running_proxy(two_workers.url) as proxy, aiohttp.ClientSession() as session:
        url = http_url(proxy)
        for i in range(50):
            async with session.get(url + ("/metrics", "/metrics/pool")[i % 2]) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain")
                assert "vllm:num_requests_waiting{" in await resp.text()
        assert metric(proxy, "hangup_proxy_scrapes_total", status="200") == 50
        assert total_calls(proxy) == 0
        assert not [r for r in caplog.records if r.name == CALL_LOGGER]
        async with session.get(url + "/v2/health/ready") as resp:  # anything else is a call
            assert resp.status == 200
        assert total_calls(proxy) == 1

    async with running_proxy("http://127.0.0.1:9") as proxy, aiohttp.ClientSession() as session:
        async with session.get(http_url(proxy) + "/metrics") as resp:  # nothing listens
            assert resp.status == 502
            assert "metrics scrape of the upstream failed" in await resp.text()
        assert metric(proxy, "hangup_proxy_scrapes_total", status="502") == 1


def total_calls(proxy: Server) -> float:
    return sum(
        metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome=outcome)
        for outcome in ("completed", "upstream_error", "rejected", "cancelled")
    )
