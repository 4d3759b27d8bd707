"""The hangup cancel adapter, on the proxy's HTTP/1.1 client, against a raw loopback endpoint
that answers with exact bytes: keep-alive reuse, a reused connection the server had closed, the
framings a server may answer with, and answers that are not HTTP at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from bench.base.waiting import wait_until
from bench.harness.raw_http import RawServer, read_request
from hangup_contract.cancel_labels import Reason
from proxy.cancel.canceller import Canceller
from proxy.cancel.http import HangupCancel, HttpCancelAdapter
from proxy.labels import CallProtocol, CancelResult
from proxy.metrics import ProxyMetrics

CANCELLED = b'{"request_id": "x", "state": "cancelled", "phase": "decode"}'


def _plain(body: bytes = CANCELLED, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _ends_connection(answer: bytes) -> bool:
    return answer.startswith(b"HTTP/1.0") or b"Connection: close" in answer


@dataclass
class RawEndpoint:
    """Answers each cancel request with the next scripted bytes; ``None`` closes instead."""

    script: deque[bytes | None] = field(default_factory=deque)
    close_after: bool = False  # close each connection after its answer (an idle timeout)
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    server: RawServer | None = None

    @property
    def connections(self) -> int:
        assert self.server is not None
        return self.server.connections

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            self.requests.append((lines[0], headers, body))
            answer = self.script.popleft() if self.script else _plain()
            if answer is None:
                return
            writer.write(answer)
            await writer.drain()
            if self.close_after or _ends_connection(answer):
                return


@pytest.fixture
async def endpoint() -> AsyncIterator[RawEndpoint]:
    raw = RawEndpoint()
    async with RawServer(raw.serve) as server:
        raw.server = server
        yield raw


def _canceller(raw: RawEndpoint, deadline: float = 5.0) -> Canceller:
    adapter = HttpCancelAdapter(HangupCancel(), f"http://127.0.0.1:{raw.port}/base", "tok", 1.0)
    return Canceller(
        {CallProtocol.HTTP: adapter},
        ProxyMetrics(CollectorRegistry()),
        deadline=deadline,
        backoff=0.01,
        backoff_max=0.05,
        concurrency=4,
    )


def _count(canceller: Canceller, result: CancelResult) -> float:
    value = canceller.metrics.registry.get_sample_value(
        "hangup_proxy_cancel_calls_total", {"adapter": "hangup", "result": result}
    )
    return 0.0 if value is None else value


async def _cancel(canceller: Canceller, request_id: str) -> CancelResult | None:
    return await canceller.submit(request_id, Reason.CLIENT_DISCONNECT, time.monotonic())


async def test_cancels_share_one_keep_alive_connection(endpoint: RawEndpoint) -> None:
    canceller = _canceller(endpoint)
    try:
        results = [await _cancel(canceller, f"id/{i}") for i in range(3)]
    finally:
        await canceller.close()
    assert results == [CancelResult.OK] * 3
    assert endpoint.connections == 1
    line, headers, body = endpoint.requests[1]
    assert line == "POST /base/v2/requests/id%2F1/cancel HTTP/1.1"
    assert headers["authorization"] == "Bearer tok"
    assert headers["host"] == f"127.0.0.1:{endpoint.port}"
    assert json.loads(body) == {"reason": "client_disconnect"}


async def test_connections_the_server_closes_are_replaced(
    endpoint: RawEndpoint,
) -> None:
    """The server ends each connection after answering (an idle timeout, unannounced)."""
    endpoint.close_after = True
    canceller = _canceller(endpoint)
    try:
        assert await _cancel(canceller, "id-1") is CancelResult.OK
        # The next cancel may find the closed connection still in the pool, or notice the close.
        assert await _cancel(canceller, "id-2") is CancelResult.OK
        endpoint.script.extend([None])  # the next request's connection dies unanswered
        assert await _cancel(canceller, "id-3") is CancelResult.OK  # retried by the canceller
    finally:
        await canceller.close()
    assert _count(canceller, CancelResult.OK) == 3
    assert _count(canceller, CancelResult.GAVE_UP) == 0
    assert [r[0].split()[1].split("/")[-2] for r in endpoint.requests] == [
        "id-1",
        "id-2",
        "id-3",
        "id-3",
    ]


async def test_a_connection_is_kept_ready_after_the_server_closes_idle_ones(
    endpoint: RawEndpoint,
) -> None:
    """Servers close idle keep-alive connections; the next hang-up should not wait for a connect."""
    endpoint.close_after = True
    canceller = _canceller(endpoint)
    adapter = canceller.adapters[CallProtocol.HTTP]
    assert isinstance(adapter, HttpCancelAdapter)
    try:
        assert await _cancel(canceller, "id-1") is CancelResult.OK
        # The spare, opened once the first one is seen closed.
        await wait_until(lambda: endpoint.connections >= 2, 5.0, "a connection opened in advance")
        ready = adapter.send_now("id-2", Reason.CLIENT_DISCONNECT)
        assert ready is not None  # written at once, on the connection opened in advance
        assert await ready is CancelResult.OK
    finally:
        await canceller.close()
    assert endpoint.connections == 2
    assert [r[0].split()[1].split("/")[-2] for r in endpoint.requests] == ["id-1", "id-2"]


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'9\r\n{"state":\r\n0c\r\n "finished"}\r\n0\r\n\r\n',
            CancelResult.FINISHED,
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + _plain(), CancelResult.OK),
        (b"HTTP/1.0 200 OK\r\n\r\n" + CANCELLED, CancelResult.OK),
        (_plain(extra=b"Connection: close\r\n"), CancelResult.OK),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", CancelResult.NOT_FOUND),
    ],
)
async def test_answer_framings(endpoint: RawEndpoint, answer: bytes, result: CancelResult) -> None:
    endpoint.script.append(answer)
    canceller = _canceller(endpoint)
    try:
        assert await _cancel(canceller, "id-1") is result
        assert await _cancel(canceller, "id-2") is CancelResult.OK  # the connection still works
    finally:
        await canceller.close()
    assert len(endpoint.requests) == 2


async def test_an_answer_that_is_not_http_is_retried_then_given_up(
    endpoint: RawEndpoint,
) -> None:
    endpoint.script.extend([b"SSH-2.0-OpenSSH\r\n\r\n"] * 100)
    canceller = _canceller(endpoint, deadline=0.3)
    try:
        assert await _cancel(canceller, "id-1") is CancelResult.GAVE_UP
    finally:
        await canceller.close()
    assert len(endpoint.requests) >= 2  # retried with backoff until the deadline
    assert _count(canceller, CancelResult.GAVE_UP) == 1
