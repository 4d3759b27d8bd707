"""The cancel path: the hangup adapter against a scripted cancel endpoint, and the canceller's
retries, deadline, concurrency bound and drain. The endpoint is a real aiohttp server on loopback;
"down" is a port nothing listens on.
"""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from hangup_contract.cancel_labels import Reason
from proxy.cancel.canceller import Canceller
from proxy.cancel.http import HangupCancel, HttpCancelAdapter
from proxy.labels import CallProtocol, CancelResult
from proxy.metrics import ProxyMetrics
from tests.support.proxy_harness import http_url, raw_request, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream


def _canceller(
    url: str, *, deadline: float = 5.0, concurrency: int = 8, attempt: float = 1.0
) -> Canceller:
    metrics = ProxyMetrics(CollectorRegistry())
    adapter = HttpCancelAdapter(HangupCancel(), url, "tok", attempt)
    return Canceller(
        {CallProtocol.HTTP: adapter}, metrics, deadline=deadline, backoff=0.01, backoff_max=0.05,
        concurrency=concurrency,
    )  # fmt: skip


def _count(canceller: Canceller, result: CancelResult) -> float:
    registry = canceller.metrics.registry
    value = registry.get_sample_value(
        "hangup_proxy_cancel_calls_total", {"adapter": "hangup", "result": result}
    )
    return 0.0 if value is None else value


def _dead_url() -> str:
    """A loopback port that refuses connections (bound, never listening)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        ((200, {"state": "cancelled", "phase": "decode"}), CancelResult.OK),
        ((200, {"state": "finished"}), CancelResult.FINISHED),
        ((404, {"error": "unknown"}), CancelResult.NOT_FOUND),
        ((401, {"error": "bad token"}), CancelResult.ERROR),
        ((200, {"state": []}), CancelResult.ERROR),  # found by tests/pure/test_properties.py
        ((200, {"state": "cancelled", "phase": {}}), CancelResult.ERROR),
        # A newer gateway: a phase and a field this proxy does not know; still cancelled.
        ((200, {"state": "cancelled", "phase": "transfer", "kv_blocks": 7}), CancelResult.OK),
        # A disaggregated gateway's answer: the transfer phase and a per-leg breakdown.
        (
            (200, {"state": "cancelled", "phase": "transfer", "legs": [{"phase": "decode"}]}),
            CancelResult.OK,
        ),
    ],
)
async def test_answers_map_to_results(
    upstream: ScriptedUpstream, answer: tuple[int, dict[str, object]], result: CancelResult
) -> None:
    upstream.cancel_default = answer
    canceller = _canceller(upstream.url)
    try:
        assert await canceller.submit("id-1", Reason.CLIENT_DISCONNECT, time.monotonic()) is result
    finally:
        await canceller.close()
    assert upstream.cancels[0].request_id == "id-1"
    assert upstream.cancels[0].reason == "client_disconnect"
    assert upstream.cancels[0].authorization == "Bearer tok"
    assert len(upstream.cancels) == 1  # no retry for an answer that retrying cannot change
    assert _count(canceller, result) == 1


async def test_server_errors_are_retried_until_an_answer(upstream: ScriptedUpstream) -> None:
    upstream.cancel_script.extend([(503, {}), (500, {}), (200, {"state": "cancelled"})])
    canceller = _canceller(upstream.url)
    try:
        assert (
            await canceller.submit("id-2", Reason.PROXY_TIMEOUT, time.monotonic())
            is CancelResult.OK
        )
    finally:
        await canceller.close()
    assert [c.request_id for c in upstream.cancels] == ["id-2"] * 3
    assert _count(canceller, CancelResult.OK) == 1 and _count(canceller, CancelResult.GAVE_UP) == 0


async def test_a_down_endpoint_is_given_up_at_the_deadline() -> None:
    canceller = _canceller(_dead_url(), deadline=0.3)
    started = time.monotonic()
    try:
        assert (
            await canceller.submit("id-3", Reason.CLIENT_DISCONNECT, started)
            is CancelResult.GAVE_UP
        )
    finally:
        await canceller.close()
    assert time.monotonic() - started < 2.0  # bounded by the deadline, not by attempts
    assert _count(canceller, CancelResult.GAVE_UP) == 1


async def test_a_slow_endpoint_is_given_up_and_bounded_in_concurrency(
    upstream: ScriptedUpstream,
) -> None:
    upstream.cancel_default = "hang"
    canceller = _canceller(upstream.url, deadline=0.5, concurrency=2, attempt=5.0)
    try:
        tasks = [
            canceller.submit(f"id-{i}", Reason.CLIENT_DISCONNECT, time.monotonic())
            for i in range(6)
        ]
        assert await asyncio.gather(*tasks) == [CancelResult.GAVE_UP] * 6
    finally:
        await canceller.close()
    assert upstream.cancels_inflight_max == 2
    assert _count(canceller, CancelResult.GAVE_UP) == 6


async def test_drain_stops_unanswered_cancels_as_given_up(upstream: ScriptedUpstream) -> None:
    upstream.cancel_default = "hang"
    canceller = _canceller(upstream.url, deadline=60.0, attempt=60.0)
    try:
        task = canceller.submit("id-4", Reason.SHUTDOWN, time.monotonic())
        await upstream.wait_cancels(1)
        await canceller.drain(0.05)
        assert task.cancelled()
    finally:
        await canceller.close()
    assert _count(canceller, CancelResult.GAVE_UP) == 1


async def test_a_dead_cancel_endpoint_never_blocks_other_streams(
    upstream: ScriptedUpstream,
) -> None:
    """Hang-ups pile up cancels against a dead endpoint while other streams keep flowing."""
    async with running_proxy(upstream.url, cancel_url=_dead_url(), cancel_deadline=2.0) as proxy:
        for _ in range(5):
            _, writer = await raw_request(
                proxy.addresses["http"], b"POST /hold HTTP/1.1\r\nHost: m\r\n\r\n"
            )
            await upstream.held.wait()
            upstream.held.clear()
            writer.close()
        assert proxy.state is not None
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.get(http_url(proxy) + "/sse?events=20") as resp:
                    body = await resp.read()
                assert body.count(b"data: ") == 21
        assert proxy.state.canceller.pending >= 1  # they were still retrying meanwhile
