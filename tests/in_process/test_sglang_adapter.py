"""``--cancel-adapter sglang`` in front of the scripted SGLang stand-in (not SGLang: see
``tests/support/sglang_scripted.py`` for what it plays, from SGLang 0.5.23's documented
behaviour). The proxy writes the call's id into the body's ``rid``, and a hang-up becomes
``POST /abort_request`` by that rid, so even a non-streaming request, which SGLang would notice
only seconds later, stops at once, and no neighbour whose rid starts the same way goes with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.config import AdapterName
from proxy.server import Server
from tests.support.proxy_harness import http_url, metric, raw_request, running_proxy, wait_metric
from tests.support.sglang_scripted import ScriptedSGLang

KEY = "admin-key"
LONG = 2000  # tokens: 20 s at the scripted 10 ms a step, far longer than any test waits


@pytest.fixture
async def sglang() -> AsyncIterator[ScriptedSGLang]:
    server = ScriptedSGLang(admin_key=KEY)
    await server.start()
    yield server
    await server.stop()


def _proxy(sglang: ScriptedSGLang, **overrides: Any) -> Any:
    return running_proxy(
        sglang.url, cancel_adapter=AdapterName.SGLANG, cancel_token=KEY, **overrides
    )


def _request(body: dict[str, Any], extra: str = "") -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: model\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{extra}\r\n"
    )
    return head.encode() + payload


async def _hang_up_once_running(
    proxy: Server, sglang: ScriptedSGLang, body: dict[str, Any], extra: str = ""
) -> str:
    """Send ``body``, hang up once its first run has a token; the rid the server ran it as."""
    known = set(sglang.runs)
    _, writer = await raw_request(proxy.addresses["http"], _request(body, extra))
    await sglang.wait_for(lambda: any(r.tokens for k, r in sglang.runs.items() if k not in known))
    (rid, *_) = [k for k in sglang.runs if k not in known]
    writer.close()
    return rid


async def test_the_call_id_travels_in_the_body_and_nothing_else_changes(
    sglang: ScriptedSGLang, session: aiohttp.ClientSession
) -> None:
    body = {"model": "m", "prompt": "Hi", "max_tokens": 3, "rid": "the-client-s-own"}
    async with (
        _proxy(sglang) as proxy,
        session.post(http_url(proxy) + "/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        call_id = resp.headers["X-Request-Id"]
    sent = json.loads(sglang.bodies[-1])
    assert sent.pop("rid") == call_id + "~"  # the client's rid is replaced, as its X-Request-Id is
    assert sent == {k: v for k, v in body.items() if k != "rid"}
    assert int(sglang.headers[-1]["Content-Length"]) == len(sglang.bodies[-1])
    assert sglang.runs[call_id + "~"].ended == "finished"
    assert not sglang.aborts


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hang_up_aborts_the_request_by_its_rid_at_once(
    sglang: ScriptedSGLang, stream: bool
) -> None:
    """Without the adapter a non-streaming request would run until SGLang's next 4 s check."""
    body = {"model": "m", "prompt": "Hi", "max_tokens": LONG, "stream": stream}
    async with _proxy(sglang) as proxy:
        rid = await _hang_up_once_running(proxy, sglang, body)
        await sglang.wait_for(lambda: sglang.runs[rid].ended is not None, within=2.0)
        assert sglang.runs[rid].ended == "aborted"
        (abort,) = sglang.aborts
        assert (abort.rid, abort.abort_all, abort.authorization) == (rid, False, f"Bearer {KEY}")
        await wait_metric(
            proxy, "hangup_proxy_cancel_calls_total", 1, adapter="sglang", result="ok"
        )
        assert metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="cancelled")


async def test_every_choice_of_a_hung_up_call_is_aborted(sglang: ScriptedSGLang) -> None:
    body = {"model": "m", "prompt": "Hi", "max_tokens": LONG, "n": 3}
    async with _proxy(sglang) as proxy:
        rid = await _hang_up_once_running(proxy, sglang, body)
        parent = rid.removesuffix("_0")
        children = [f"{parent}_{i}" for i in range(3)]
        await sglang.wait_for(lambda: all(sglang.runs[c].ended for c in children))
        assert [sglang.runs[c].ended for c in children] == ["aborted"] * 3
        assert [a.rid for a in sglang.aborts] == [parent]


async def test_a_neighbour_whose_id_starts_the_same_is_left_running(
    sglang: ScriptedSGLang,
) -> None:
    """SGLang aborts by rid prefix; trusted client ids "ab" and "abc" must not share a fate."""
    body = {"model": "m", "prompt": "Hi", "max_tokens": LONG}
    async with _proxy(sglang, trust_client_request_id=True) as proxy:
        _, neighbour = await raw_request(
            proxy.addresses["http"], _request(body, "X-Request-Id: abc\r\n")
        )
        await sglang.wait_for(lambda: "abc~" in sglang.runs)
        rid = await _hang_up_once_running(proxy, sglang, body, "X-Request-Id: ab\r\n")
        assert rid == "ab~"
        await sglang.wait_for(lambda: sglang.runs["ab~"].ended is not None)
        assert sglang.runs["ab~"].ended == "aborted"
        assert sglang.runs["abc~"].ended is None  # still generating
        neighbour.close()
        await sglang.wait_for(lambda: sglang.runs["abc~"].ended is not None)


async def test_a_body_that_is_not_json_passes_untouched_and_the_log_says_so(
    sglang: ScriptedSGLang, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="hangup.proxy.http")
    async with (
        _proxy(sglang) as proxy,
        session.post(http_url(proxy) + "/generate", data=b"plain words") as resp,
    ):
        assert resp.status == 400  # SGLang's answer, relayed
        call_id = resp.headers["X-Request-Id"]
    assert sglang.bodies == [b"plain words"]
    (line,) = [r for r in caplog.records if "not tagged" in r.getMessage()]
    assert "not JSON" in line.getMessage() and line.fields == {"request_id": call_id}  # type: ignore[attr-defined]


async def test_a_refused_abort_is_counted_an_error_and_a_failing_one_is_retried(
    sglang: ScriptedSGLang,
) -> None:
    sglang.abort_script.extend([503, 503])  # then 200
    body = {"model": "m", "prompt": "Hi", "max_tokens": LONG, "stream": True}
    async with _proxy(sglang, cancel_backoff=0.01) as proxy:
        rid = await _hang_up_once_running(proxy, sglang, body)
        await sglang.wait_for(lambda: sglang.runs[rid].ended is not None)
        await wait_metric(
            proxy, "hangup_proxy_cancel_calls_total", 1, adapter="sglang", result="ok"
        )
        assert len(sglang.aborts) == 3
    sglang.admin_key = "another"
    async with _proxy(sglang) as proxy:
        await _hang_up_once_running(proxy, sglang, body)
        await wait_metric(
            proxy, "hangup_proxy_cancel_calls_total", 1, adapter="sglang", result="error"
        )
        assert len(sglang.aborts) == 4  # a 401 is not retried
