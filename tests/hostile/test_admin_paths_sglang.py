"""SGLang's admin routes through the sidecar (``--cancel-adapter sglang``), in front of the scripted
stand-in (``tests/support/sglang_scripted.py``: not SGLang, which cannot run here). Without the
refusal one client's ``POST /abort_request {"abort_all": true}`` ends every call in flight; the
sidecar's own abort (its cancel calls go to ``--cancel-url``, not through its listener) still
ends a hung-up call by its rid.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.config import AdapterName
from tests.support.proxy_harness import http_url, metric, running_proxy
from tests.support.sglang_scripted import ScriptedSGLang

LONG = 2000  # tokens: 20 s at the scripted 10 ms a step


@pytest.fixture
async def sglang() -> AsyncIterator[ScriptedSGLang]:
    server = ScriptedSGLang()
    await server.start()
    yield server
    await server.stop()


async def test_one_client_cannot_abort_every_call_through_the_sidecar(
    sglang: ScriptedSGLang, session: aiohttp.ClientSession
) -> None:
    body = {"model": "m", "prompt": "Hi", "max_tokens": LONG, "stream": True}
    attack = {"rid": "", "abort_all": True}
    async with running_proxy(sglang.url, cancel_adapter=AdapterName.SGLANG) as proxy:
        base = http_url(proxy)
        victim = await session.post(base + "/v1/completions", json=body)
        await sglang.wait_for(lambda: any(run.tokens for run in sglang.runs.values()))
        for target in ("/abort_request", "//abort_request/", "/%61bort_request", "/Abort_Request"):
            async with session.post(base + target, json=attack) as answer:
                text = await answer.text()
                assert answer.status == 403, (target, answer.status, text)
                assert "rule sglang-abort" in json.loads(text)["error"]["message"]
        await asyncio.sleep(0.1)  # ten steps: an abort relayed would have landed
        assert sglang.live() and not sglang.aborts
        assert metric(proxy, "hangup_proxy_admin_refusals_total",
                      protocol="http", rule="sglang-abort") == 4  # fmt: skip
        # Straight, the same call ends every request the server runs.
        async with session.post(sglang.url + "/abort_request", json=attack) as answer:
            assert answer.status == 200
        assert not sglang.live()
        victim.close()


async def test_the_admin_routes_are_refused_and_generation_passes(
    sglang: ScriptedSGLang, session: aiohttp.ClientSession
) -> None:
    async with running_proxy(sglang.url, cancel_adapter=AdapterName.SGLANG) as proxy:
        base = http_url(proxy)
        for route in ("/flush_cache", "/update_weights_from_disk", "/get_server_info",
                      "/pause_generation", "/configure_logging", "/load_lora_adapter"):  # fmt: skip
            async with session.post(base + route, json={}) as answer:
                assert answer.status == 403, route
                assert "rule sglang-admin" in json.dumps(await answer.json())
        body = {"model": "m", "prompt": "Hi", "max_tokens": 3}
        async with session.post(base + "/v1/completions", json=body) as answer:
            assert answer.status == 200, await answer.text()
