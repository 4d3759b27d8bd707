"""Responses calls (the real ``openai`` client's ``responses.create``) through ``hangup-proxy
--cancel-adapter vllm`` in front of the real ``vllm serve`` (tiny local model,
``VLLM_SERVER_DEV_MODE=1`` for ``/abort_requests``, ``VLLM_ENABLE_RESPONSES_API_STORE=1`` for
background responses), in both modes: ``close`` (a hang-up closes the upstream stream; vLLM aborts
on disconnect) and ``abort`` (the proxy writes ``request_id: resp_{id}`` into the body and calls
``/abort_requests`` with ``resp_{id}_0`` too).

vLLM's Responses route ignores ``X-Request-Id``: its engine request is ``{body's request_id}_0``.
The client here sends a ``request_id`` of its own, ``client-{id}``: in ``close`` mode vLLM runs
it as given, in ``abort`` mode the proxy replaces it; vLLM's log (``--enable-log-requests``) shows
which engine request was aborted, and by which path. vLLM's own
``POST /v1/responses/{id}/cancel`` cannot stop a response that is not background (404 while it
runs), which is why the hang-up must do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import openai
import pytest

from bench.base.scrape import metric_sum, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import MODEL, WAIT_S
from proxy.cancel.servers import vllm_request_ids
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.vllm_fixtures import requires_vllm
from tests.support.vllm_serve_fronts import MODES

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_vllm]

DECODE_TOKENS = 20  # a hang-up comes after this many tokens
LONG = 2000  # output tokens of a call that is hung up on (seconds of decoding)
LONGER = 7000  # a background response that must outlive its client, a retrieve and a resume
LIVES_ON = 50  # tokens a background response must make after its client left
PROXY_COUNTS = {
    "hangup_proxy_requests_total": {"outcome": "cancelled"},
    "hangup_proxy_cancels_total": {"reason": "client_disconnect"},
    "hangup_proxy_cancel_calls_total": {"result": "ok"},
}


class Served(serve_fronts.Served):
    def tokens(self) -> float:
        return total(self.samples(), "vllm:generation_tokens_total")

    def counts(self, mode: str) -> dict[str, float]:
        admin = self.fronts[mode].url("admin")
        return {name: metric_sum(admin, name, **labels) for name, labels in PROXY_COUNTS.items()}


@pytest.fixture(scope="module")
def served(vllm_serve_fronts: serve_fronts.Served) -> Served:
    return Served(vllm_serve_fronts.url, vllm_serve_fronts.log, vllm_serve_fronts.fronts)


@pytest.fixture
async def ready(served: Served) -> Served:
    """``served``, checked idle first."""
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle")
    return served


@contextlib.asynccontextmanager
async def _client(served: Served, mode: str) -> AsyncIterator[openai.AsyncOpenAI]:
    api = openai.AsyncOpenAI(
        base_url=served.fronts[mode].url() + "/v1", api_key="unused", max_retries=0
    )
    try:
        yield api
    finally:
        await api.close()


def _ids(mode: str) -> tuple[str, dict[str, object], str]:
    """A call id, the request options that send it, and the response id vLLM will give it."""
    call_id = uuid.uuid4().hex
    options: dict[str, object] = {
        "extra_headers": {"X-Request-Id": call_id},
        "extra_body": {"request_id": f"client-{call_id}", "ignore_eos": True},
    }
    return call_id, options, f"resp_{call_id}" if mode == "abort" else f"client-{call_id}"


async def _aborted(served: Served, mode: str, call_id: str, response_id: str) -> None:
    """vLLM goes idle, and its log shows the call's engine request aborted by ``mode``'s path:
    the proxy's ``/abort_requests`` call, or the closed connection."""
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle again")
    by_endpoint = f"Aborted request(s) {','.join(vllm_request_ids(call_id))}."
    on_disconnect = f"Request {response_id}_0 aborted."
    await asyncio.to_thread(
        poll_until,
        lambda: served.logged(by_endpoint) or served.logged(on_disconnect),
        10,
        "vLLM's abort log",
    )
    assert served.logged(by_endpoint) is (mode == "abort"), response_id
    assert served.logged(on_disconnect) is (mode == "close"), response_id


def _assert_cancelled_once(served: Served, mode: str, before: dict[str, float]) -> None:
    after = served.counts(mode)
    assert after["hangup_proxy_requests_total"] - before["hangup_proxy_requests_total"] == 1
    assert after["hangup_proxy_cancels_total"] - before["hangup_proxy_cancels_total"] == 1
    calls = after["hangup_proxy_cancel_calls_total"] - before["hangup_proxy_cancel_calls_total"]
    assert calls == (1 if mode == "abort" else 0)


@pytest.mark.parametrize("mode", MODES)
async def test_a_hang_up_on_a_streaming_response_aborts_it_in_vllm(
    ready: Served, mode: str
) -> None:
    before = ready.counts(mode)
    call_id, options, response_id = _ids(mode)
    async with _client(ready, mode) as api:
        stream = await api.responses.create(
            model=MODEL, input="Hello", max_output_tokens=LONG, stream=True, **options
        )
        deltas = 0
        async for event in stream:
            if event.type == "response.created":
                assert event.response.id == response_id
            deltas += event.type == "response.output_text.delta"
            if deltas == DECODE_TOKENS:
                break
        with pytest.raises(openai.NotFoundError):  # vLLM's own cancel cannot reach it
            await api.responses.cancel(response_id)
        await stream.close()  # the client hangs up
    await _aborted(ready, mode, call_id, response_id)
    _assert_cancelled_once(ready, mode, before)


@pytest.mark.parametrize("mode", MODES)
async def test_a_hang_up_on_a_synchronous_response_aborts_it_in_vllm(
    ready: Served, mode: str
) -> None:
    before, tokens = ready.counts(mode), ready.tokens()
    call_id, options, response_id = _ids(mode)
    async with _client(ready, mode) as api:
        pending = asyncio.ensure_future(
            api.responses.create(model=MODEL, input="Hello", max_output_tokens=LONG, **options)
        )
        await asyncio.to_thread(
            poll_until, lambda: ready.tokens() - tokens >= DECODE_TOKENS, WAIT_S, "decoding"
        )
        assert not pending.done(), "a 2,000-token answer cannot be complete yet"
        pending.cancel()  # the client hangs up: httpx drops the connection
        with pytest.raises(asyncio.CancelledError):
            await pending
    await _aborted(ready, mode, call_id, response_id)
    _assert_cancelled_once(ready, mode, before)


@pytest.mark.parametrize("mode", MODES)
async def test_a_background_response_outlives_its_client_until_cancelled(
    ready: Served, mode: str
) -> None:
    """The client leaves its streaming background response, then a resumed stream of it; the
    response runs on (vLLM keeps decoding it), the proxy cancels nothing, and only
    ``responses.cancel`` through the proxy stops it."""
    before = ready.counts(mode)
    _, options, response_id = _ids(mode)
    async with _client(ready, mode) as api:
        stream = await api.responses.create(
            model=MODEL, input="Hello", max_output_tokens=LONGER, stream=True, background=True,
            **options,
        )  # fmt: skip
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
            assert event.type != "response.created" or event.response.id == response_id
        await stream.close()  # the client hangs up on the POST
        await _lives_on(ready, mode, before["hangup_proxy_requests_total"] + 1)
        resumed = await api.responses.retrieve(response_id, stream=True, starting_after=0)
        async for _ in resumed:
            break
        await resumed.close()  # and on the resumed stream
        await _lives_on(ready, mode, before["hangup_proxy_requests_total"] + 2)
        stored = await api.responses.retrieve(response_id)
        assert stored.status in ("queued", "in_progress")
        cancelled = await api.responses.cancel(response_id)
        assert cancelled.status == "cancelled"
    await asyncio.to_thread(poll_until, ready.idle, WAIT_S, "vLLM idle after the cancel")
    after = ready.counts(mode)
    assert after["hangup_proxy_requests_total"] - before["hangup_proxy_requests_total"] == 2
    for name in ("hangup_proxy_cancels_total", "hangup_proxy_cancel_calls_total"):
        assert after[name] == before[name], name  # the proxy cancelled nothing


async def _lives_on(served: Served, mode: str, ended: float) -> None:
    """Once the proxy has ended the call its client left (``ended`` calls ended by their client
    so far), vLLM goes on decoding the response."""
    await asyncio.to_thread(
        poll_until,
        lambda: served.counts(mode)["hangup_proxy_requests_total"] >= ended,
        WAIT_S,
        "the proxy to end the call",
    )
    tokens = served.tokens()
    await asyncio.to_thread(
        poll_until, lambda: served.tokens() - tokens >= LIVES_ON, WAIT_S, "decoding on"
    )
    assert total(served.samples(), "vllm:num_requests_running") == 1
