"""``python -m proxy`` as users run it, in front of the real gateway: SIGTERM drain, a cancel
endpoint that is down while streams keep flowing, a bad flag.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from bench.base.addresses import host_port
from bench.base.processes import REPO, child_env
from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.stack import (
    MODEL,
    RawClients,
    completion_request,
    in_flight,
    running_stack,
)

SLOW = ["--sim-slots", "4", "--sim-step-base", "0.05"]


async def test_sigterm_drains_finishes_short_calls_and_cancels_the_rest(
    tmp_path: Path, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    with running_stack(
        tmp_path, SLOW, ["--trust-client-request-id", "--drain-timeout", "1"]
    ) as stack:
        long_body = {"model": MODEL, "prompt": "long", "max_tokens": 3000}
        short_body = {"model": MODEL, "prompt": "short", "max_tokens": 10, "stream": True}
        _, long_call = await raw.open(
            stack.proxy_url, completion_request("/v1/completions", long_body, request_id="long")
        )
        short = await session.post(stack.proxy_url + "/v1/completions", json=short_body)
        assert short.status == 200
        await wait_until(
            lambda: _listed(session, stack.gateway_url, "long"), what="the long call upstream"
        )

        assert set(stack.proxy.listeners) == {"http", "grpc", "admin"}  # every listener named
        assert stack.proxy.listeners["grpc"].startswith("127.0.0.1:")
        assert await _status(session, stack.admin_url + "/healthz", 200)
        assert await _status(session, stack.admin_url + "/readyz", 200)

        stack.proxy.popen.terminate()  # SIGTERM
        await wait_until(
            lambda: _status(session, stack.admin_url + "/readyz", 503), what="/readyz 503"
        )
        with pytest.raises(OSError):  # the HTTP listener no longer accepts connections
            socket.create_connection(host_port(stack.proxy.listeners["http"]), timeout=5).close()
        body = await short.read()  # a call that ends within the drain timeout ends normally
        assert body.endswith(b"data: [DONE]\n\n")

        await asyncio.to_thread(stack.proxy.popen.wait, 30)
        assert stack.proxy.popen.returncode == 0
        gw = await scrape_async(session, stack.gateway_url)
        assert (
            total(gw, "hangup_gateway_cancellations_total", reason="shutdown", phase="decode") == 1
        )
        assert not await in_flight(session, stack.gateway_url)
        long_call.close()


async def test_dead_cancel_endpoint_gives_up_while_streams_keep_flowing(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    args = ["--cancel-url", f"http://127.0.0.1:{dead.getsockname()[1]}", "--cancel-deadline", "5"]
    with running_stack(tmp_path, SLOW, args) as stack:
        body = {"model": MODEL, "prompt": "abandoned", "max_tokens": 3000, "stream": True}
        left = await session.post(stack.proxy_url + "/v1/completions", json=body)
        await left.content.readuntil(b"\n\n")
        left.close()  # hang up; the cancel call will be refused and retried
        ok = {"model": MODEL, "prompt": "meanwhile", "max_tokens": 5, "stream": True}
        for _ in range(3):
            async with session.post(stack.proxy_url + "/v1/completions", json=ok) as resp:
                assert (await resp.read()).endswith(b"data: [DONE]\n\n")
        px = await scrape_async(session, stack.admin_url)
        assert total(px, "hangup_proxy_cancel_calls_pending") == 1  # still retrying meanwhile

        async def gave_up() -> bool:
            samples = await scrape_async(session, stack.admin_url)
            return total(samples, "hangup_proxy_cancel_calls_total", result="gave_up") == 1

        await wait_until(gave_up, within=20, what="the cancel call to be given up")
        # The upstream stream was closed all the same: the gateway saw the hang-up by itself.
        await wait_until(lambda: _empty(session, stack.gateway_url), what="nothing in flight")
    dead.close()


async def _listed(session: aiohttp.ClientSession, url: str, rid: str) -> bool:
    return rid in await in_flight(session, url)


async def _empty(session: aiohttp.ClientSession, url: str) -> bool:
    return not await in_flight(session, url)


async def _status(session: aiohttp.ClientSession, url: str, status: int) -> bool:
    async with session.get(url) as resp:
        return resp.status == status


async def test_max_request_duration_reaches_the_gateway_as_proxy_timeout(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    with running_stack(tmp_path, SLOW, ["--max-request-duration", "0.5"]) as stack:
        body = {"model": MODEL, "prompt": "too long", "max_tokens": 3000}
        async with session.post(stack.proxy_url + "/v1/completions", json=body) as resp:
            assert resp.status == 504
            assert "max-request-duration" in (await resp.json())["error"]["message"]
        await wait_until(lambda: _empty(session, stack.gateway_url), what="nothing in flight")
        gw = await scrape_async(session, stack.gateway_url)
        assert (
            total(gw, "hangup_gateway_cancellations_total", reason="proxy_timeout", phase="decode")
            == 1
        )
        assert total(gw, "hangup_gateway_cancellations_total") == 1


async def test_a_second_sigterm_ends_the_drain_at_once(
    tmp_path: Path, session: aiohttp.ClientSession, raw: RawClients
) -> None:
    with running_stack(
        tmp_path, SLOW, ["--trust-client-request-id", "--drain-timeout", "600"]
    ) as stack:
        body = {"model": MODEL, "prompt": "long", "max_tokens": 3000}
        _, call = await raw.open(
            stack.proxy_url, completion_request("/v1/completions", body, request_id="held")
        )
        await wait_until(
            lambda: _listed(session, stack.gateway_url, "held"), what="the call upstream"
        )
        stack.proxy.popen.terminate()
        await wait_until(
            lambda: _status(session, stack.admin_url + "/readyz", 503), what="/readyz 503"
        )
        stack.proxy.popen.terminate()  # the second signal: no 600 s wait
        assert await asyncio.to_thread(stack.proxy.popen.wait, 30) == 0
        gw = await scrape_async(session, stack.gateway_url)
        assert total(gw, "hangup_gateway_cancellations_total", reason="shutdown") == 1
        call.close()


def test_a_bad_flag_exits_with_a_clear_message() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "--http-port", "eighty"],
        capture_output=True,
        env=child_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert b"--http-port='eighty'" in done.stderr
