"""Responses calls through the proxy: a hang-up on a background response, or on a call about a
response an earlier call started (retrieve, resumed events), closes the upstream stream and makes
no cancel call; a hang-up on any other ``POST /v1/responses`` is cancelled as every call is.

The upstream is the scripted one (``/v1/responses`` holds the call until its client leaves);
each case waits until the upstream saw its connection close, by which time the proxy has either
submitted the cancel call or decided not to (``proxy.calls.lifecycle``).
"""

from __future__ import annotations

import json

import pytest

from proxy.config import AdapterName
from proxy.server import Server
from tests.support.proxy_harness import metric, raw_request, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream


def _post(body: bytes, *, chunked: bool) -> bytes:
    """A ``POST /v1/responses`` with ``body``, sent with a length or in two chunks (a body the
    proxy must read as it arrives)."""
    head = "POST /v1/responses HTTP/1.1\r\nHost: m\r\nContent-Type: application/json\r\n"
    if not chunked:
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    half = len(body) // 2
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in (body[:half], body[half:]))
    return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


async def _hang_up(proxy: Server, upstream: ScriptedUpstream, request: bytes) -> None:
    """Send ``request``, hang up once the upstream holds it, wait for the upstream to see it."""
    _, writer = await raw_request(proxy.addresses["http"], request)
    await upstream.held.wait()
    writer.close()
    await upstream.closed.wait()


def _cancel_calls(proxy: Server) -> float:
    """Cancel calls made or under way (a call submitted is pending until it is counted)."""
    assert proxy.state is not None
    made = sum(
        metric(proxy, "hangup_proxy_cancel_calls_total", adapter="hangup", result=result)
        for result in ("ok", "finished", "not_found", "error", "gave_up")
    )
    return made + proxy.state.canceller.pending


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize(
    ("fields", "cancelled"),
    [
        ({"stream": True}, True),
        ({}, True),
        ({"background": False, "stream": True}, True),
        ({"background": True, "stream": True}, False),
        ({"background": True}, False),
        ({"background": "true", "stream": True}, False),  # what vLLM's model reads as true
    ],
)
async def test_only_a_background_response_outlives_its_client(
    upstream: ScriptedUpstream, fields: dict[str, object], cancelled: bool, chunked: bool
) -> None:
    body = json.dumps({"model": "m", "input": "Hi", **fields}).encode()
    async with running_proxy(upstream.url) as proxy:
        await _hang_up(proxy, upstream, _post(body, chunked=chunked))
        assert upstream.held_bodies == [body]  # relayed as it came
        if cancelled:
            (cancel,) = await upstream.wait_cancels(1)
            assert cancel.reason == "client_disconnect"
        else:
            assert _cancel_calls(proxy) == 0 and not upstream.cancels
            cancels = metric(
                proxy, "hangup_proxy_cancels_total", protocol="http", reason="client_disconnect"
            )
            assert cancels == 0
        # Either way the client left: it is counted, and the call ended without completing.
        gone = {"protocol": "http", "stage": "before_response"}
        assert metric(proxy, "hangup_proxy_client_disconnects_total", **gone) == 1
        assert metric(proxy, "hangup_proxy_requests_total", protocol="http", outcome="cancelled")


@pytest.mark.parametrize(
    "target",
    [
        "GET /v1/responses/resp_1?stream=true&starting_after=3",
        "GET /v1/responses/resp_1",
        "POST /v1/responses/resp_1/cancel",
    ],
)
async def test_a_call_about_an_earlier_response_is_not_cancelled(
    upstream: ScriptedUpstream, target: str
) -> None:
    async with running_proxy(upstream.url) as proxy:
        request = f"{target} HTTP/1.1\r\nHost: m\r\nContent-Length: 0\r\n\r\n".encode()
        await _hang_up(proxy, upstream, request)
        assert _cancel_calls(proxy) == 0 and not upstream.cancels


async def test_the_vllm_adapter_relays_a_background_response_untouched_without_its_endpoint(
    upstream: ScriptedUpstream,
) -> None:
    """Without ``--vllm-abort-endpoint`` the proxy needs no id in the body: it only reads it."""
    body = json.dumps({"model": "m", "input": "Hi", "background": True, "stream": True}).encode()
    async with running_proxy(upstream.url, cancel_adapter=AdapterName.VLLM) as proxy:
        await _hang_up(proxy, upstream, _post(body, chunked=True))
        assert upstream.held_bodies == [body]
        assert proxy.state is not None and proxy.state.canceller.pending == 0
