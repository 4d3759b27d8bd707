"""How a proxied call ends (``proxy.calls.lifecycle``), decided without sockets.

Both protocol adapters end their calls through ``CallEnding``; these tests script its
collaborators instead: cancel calls whose answers the test releases, a close that records when
it ran, a log that collects lines. Each test reads like the end of one call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bench.base.waiting import run_ready_callbacks
from hangup_contract.cancel_labels import Reason
from proxy.calls.lifecycle import CallEnding
from proxy.calls.state import Call
from proxy.labels import CallProtocol, CancelResult, Outcome, Stage
from proxy.metrics import ProxyMetrics

GRACE = 0.05


class Scripted:
    """The ending of one HTTP call, with every collaborator scripted."""

    def __init__(self, *, grace: float = GRACE) -> None:
        self.registry = CollectorRegistry()
        self.submitted: list[tuple[str, Reason]] = []
        self.answers: list[asyncio.Future[CancelResult | None]] = []
        self.closes = 0
        self.lines: list[dict[str, object]] = []
        self.call = Call(CallProtocol.HTTP, "POST", "/v1/completions", "127.0.0.1")
        self.call.request_id = "call-1"
        self.ending = CallEnding(
            self.call, ProxyMetrics(self.registry), self.submit, close_grace=grace,
            gone_status=499, log=lambda call: self.lines.append(call.record()),
        )  # fmt: skip

    def submit(self, request_id: str, reason: Reason, detected_at: float) -> Any:
        self.submitted.append((request_id, reason))
        answer: asyncio.Future[CancelResult | None] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        return answer

    def close(self) -> None:
        self.closes += 1

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"protocol": "http", **labels}) or 0.0


async def test_a_call_stops_once_and_is_cancelled_once() -> None:
    s = Scripted()
    s.ending.upstream_open = True
    s.call.stage = Stage.STREAMING
    first = s.ending.stop(Reason.CLIENT_DISCONNECT)
    assert s.ending.stop(Reason.CLIENT_DISCONNECT) is first
    assert s.ending.stop(Reason.SHUTDOWN) is first  # shutdown arriving later changes nothing
    assert s.submitted == [("call-1", Reason.CLIENT_DISCONNECT)]
    assert (s.call.reason, s.call.outcome) == (Reason.CLIENT_DISCONNECT, Outcome.CANCELLED)
    disconnects = "hangup_proxy_client_disconnects_total"
    assert s.count(disconnects, stage="streaming") == 1
    assert s.count("hangup_proxy_cancels_total", reason="client_disconnect") == 1
    assert s.count("hangup_proxy_cancels_total", reason="shutdown") == 0


async def test_a_client_gone_before_the_upstream_call_costs_no_cancel() -> None:
    s = Scripted()
    assert s.ending.stop(Reason.CLIENT_DISCONNECT) is None
    assert s.submitted == [] and s.call.status == 499  # nothing was ever sent to the client
    s.ending.close_upstream(s.close)
    assert s.closes == 1
    s.ending.finish()
    assert [line["cancel_result"] for line in s.lines] == [None]
    assert s.count("hangup_proxy_requests_total", outcome="cancelled") == 1


@pytest.mark.parametrize("reason", [Reason.CLIENT_DISCONNECT, Reason.PROXY_TIMEOUT])
async def test_a_detached_call_ends_without_a_cancel(reason: Reason) -> None:
    """A background response outlives its client: the hang-up is counted, nothing is cancelled,
    and the upstream stream is closed at once."""
    s = Scripted()
    s.call.detached = True
    s.ending.upstream_open = True
    assert s.ending.stop(reason) is None
    assert s.submitted == []
    assert s.count("hangup_proxy_cancels_total", reason=reason) == 0
    s.ending.close_upstream(s.close)
    assert s.closes == 1
    s.ending.finish()
    ((line),) = s.lines
    assert line["detached"] is True and line["cancel_result"] is None
    assert line["outcome"] == "cancelled" and line["reason"] == reason


async def test_the_upstream_stays_open_until_the_cancel_is_answered() -> None:
    s = Scripted(grace=60.0)
    s.ending.upstream_open = True
    s.ending.stop(Reason.CLIENT_DISCONNECT)
    s.ending.close_upstream(s.close)
    await run_ready_callbacks()
    assert s.closes == 0, "closed before the upstream heard the reason"
    s.answers[0].set_result(CancelResult.OK)
    await asyncio.wait_for(s.ending.upstream_closed(), 1)
    assert s.closes == 1


async def test_a_slow_cancel_lets_the_upstream_close_after_the_grace() -> None:
    s = Scripted()
    s.ending.upstream_open = True
    s.ending.stop(Reason.PROXY_TIMEOUT)
    s.ending.close_upstream(s.close)
    await asyncio.wait_for(s.ending.upstream_closed(), GRACE * 20)
    assert s.closes == 1
    s.answers[0].set_result(CancelResult.OK)
    await run_ready_callbacks()
    assert s.closes == 1, "closed twice"


async def test_the_log_line_waits_for_the_cancel_answer_and_carries_it() -> None:
    s = Scripted()
    s.ending.upstream_open = True
    s.ending.stop(Reason.CLIENT_DISCONNECT)
    s.ending.finish()
    assert s.lines == [] and s.count("hangup_proxy_requests_total", outcome="cancelled") == 1
    s.answers[0].set_result(CancelResult.FINISHED)
    await run_ready_callbacks()
    (line,) = s.lines
    assert line["cancel_result"] == "finished" and isinstance(line["cancel_ms"], float)
    assert line["reason"] == "client_disconnect" and line["status"] == 499


@pytest.mark.parametrize("reason", [Reason.SHUTDOWN, Reason.PROXY_TIMEOUT])
async def test_the_proxy_ending_a_call_is_no_client_disconnect(reason: Reason) -> None:
    s = Scripted()
    s.ending.upstream_open = True
    s.ending.stop(reason)
    assert s.submitted == [("call-1", reason)]
    assert s.count("hangup_proxy_client_disconnects_total", stage="before_response") == 0
    assert s.call.status is None  # the adapter tells the client its own status


async def test_an_upstream_that_already_answered_is_not_cancelled() -> None:
    s = Scripted()
    s.ending.upstream_open, s.ending.upstream_done = True, True
    assert s.ending.stop(Reason.GRPC_CANCELLED) is None and s.submitted == []


async def test_a_call_nobody_classified_is_an_upstream_error_never_completed() -> None:
    s = Scripted()
    s.ending.finish()
    assert s.call.outcome is Outcome.UPSTREAM_ERROR
    assert s.count("hangup_proxy_requests_total", outcome="completed") == 0
