"""``hangup-proxy --cancel-adapter vllm`` in front of the real ``vllm serve`` (vLLM's OpenAI server,
tiny local model, ``VLLM_SERVER_DEV_MODE=1`` so ``POST /abort_requests`` exists), in both modes:
``close`` (a hang-up closes the upstream stream; vLLM aborts on disconnect) and ``abort`` (the
proxy also calls ``/abort_requests`` by the ids vLLM derived from the proxy's ``X-Request-Id``).

Verified from outside: vLLM's own ``/metrics`` (nothing running or waiting, the KV cache empty,
``vllm:generation_tokens_total`` stops), vLLM's own log (``--enable-log-requests``: every engine
request a hung-up call made is logged aborted, and by which path: ``Aborted request(s)
chatcmpl-{id},cmpl-{id}-0,resp_{id}_0.`` from the endpoint, ``Request cmpl-{id}-0 aborted.`` on
disconnect), and the proxy's metrics. Responses calls: ``tests/vllm/test_vllm_serve_responses.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid

import aiohttp
import pytest

from bench.base.processes import Process
from bench.base.scrape import Samples, metric_sum, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import IGNORE_EOS, LONG_PROMPT, MODEL, WAIT_S
from proxy.cancel.servers import vllm_request_ids
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.vllm_fixtures import requires_vllm
from tests.support.vllm_serve_fronts import MODES

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_vllm]

# Output tokens vLLM may still count after the client left: the tiny model makes a token every
# ~1.5 ms, and the figure includes the scrape read before the hang-up (8-30 ms on vLLM's slow
# `/metrics` when the cores are shared) and the abort's trip through the proxy. docs/benchmarks.md
# measured 0-2 on a quiet machine, up to 5 on a shared one; CI's loaded run counted 17 once. A
# hang-up that did not reach the engine costs hundreds (the decode call runs to 2000 tokens).
TOKENS_AFTER_HANG_UP = 64
DECODE_TOKENS = 20  # the decode hang-up comes after this many tokens
BATCH = 8  # --max-num-seqs of ENGINE_ARGS


class Served(serve_fronts.Served):
    def aborted_by_endpoint(self, call_id: str) -> bool:
        """vLLM's ``/abort_requests`` aborted the call's engine requests (the ``abort`` mode)."""
        return self.logged(f"Aborted request(s) {','.join(vllm_request_ids(call_id))}.")

    def aborted_on_disconnect(self, call_id: str) -> bool:
        """vLLM aborted the call's engine request because its connection closed."""
        return self.logged(f"Request cmpl-{call_id}-0 aborted.")

    def aborted(self, call_id: str) -> bool:
        return self.aborted_on_disconnect(call_id) or self.aborted_by_endpoint(call_id)

    def received(self, call_id: str) -> bool:
        return self.logged(call_id)


@pytest.fixture(scope="module")
def served(vllm_serve_fronts: serve_fronts.Served) -> Served:
    return Served(vllm_serve_fronts.url, vllm_serve_fronts.log, vllm_serve_fronts.fronts)


def leave(post: asyncio.Future[aiohttp.ClientResponse]) -> None:
    """The client hangs up: aiohttp drops the connection, whether or not the response (its
    status line, for a stream) has arrived."""
    if post.done() and not post.cancelled() and post.exception() is None:
        post.result().close()
    post.cancel()


def proxy_count(front: Process, name: str, **labels: str) -> float:
    return metric_sum(front.url("admin"), name, **labels)


async def hang_up_in(served: Served, mode: str, *, stream: bool, phase: str) -> float:
    """One call through ``mode``'s proxy that hangs up in ``phase``; the output tokens vLLM
    counted after the hang-up."""
    before = await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle")
    prompt, max_tokens = (LONG_PROMPT, 500) if phase == "prefill" else ("Hello", 2000)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
            **IGNORE_EOS}  # fmt: skip
    call_id = uuid.uuid4().hex
    url = served.fronts[mode].url() + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        post = asyncio.ensure_future(
            session.post(url, json=body, headers={"X-Request-Id": call_id})
        )

        def reached() -> Samples | None:
            s = served.samples()
            made = total(s, "vllm:generation_tokens_total") - total(
                before, "vllm:generation_tokens_total"
            )
            if phase == "prefill":
                assert not made, "prefill ended before the hang-up"
                running = total(s, "vllm:num_requests_running")
                return s if running and total(s, "vllm:kv_cache_usage_perc") else None
            return s if made >= DECODE_TOKENS else None

        at_hang_up = await asyncio.to_thread(poll_until, reached, WAIT_S, f"{phase} reached")
        leave(post)
    after = await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle again")
    await asyncio.to_thread(poll_until, lambda: served.aborted(call_id), 10, "vLLM's abort log")
    # Each mode aborts by its own path: the endpoint is answered before the stream is closed.
    by_endpoint = mode == "abort"
    assert served.aborted_by_endpoint(call_id) is by_endpoint, call_id
    assert served.aborted_on_disconnect(call_id) is not by_endpoint, call_id
    return total(after, "vllm:generation_tokens_total") - total(
        at_hang_up, "vllm:generation_tokens_total"
    )


@pytest.mark.parametrize("mode", MODES)
async def test_every_hang_up_in_prefill_and_decode_is_aborted_in_vllm(
    served: Served, mode: str
) -> None:
    front = served.fronts[mode]
    ok_before = proxy_count(front, "hangup_proxy_cancel_calls_total", result="ok")
    cancelled_before = proxy_count(front, "hangup_proxy_requests_total", outcome="cancelled")
    after: list[float] = []
    for stream in (False, True):
        for phase in ("prefill", "decode"):
            for _ in range(3):
                after.append(await hang_up_in(served, mode, stream=stream, phase=phase))
    assert max(after) <= TOKENS_AFTER_HANG_UP, after
    cancelled = proxy_count(front, "hangup_proxy_requests_total", outcome="cancelled")
    assert cancelled - cancelled_before == len(after)
    calls = proxy_count(front, "hangup_proxy_cancel_calls_total", result="ok") - ok_before
    assert calls == (len(after) if mode == "abort" else 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_cancel_by_id_on_the_sidecar_ends_the_call_in_vllm(
    served: Served, mode: str, stream: bool
) -> None:
    """``vllm serve`` has no cancel by id on its public surface (its abort endpoint is a dev
    mode's): the sidecar's own (``/v2/requests/{id}/cancel``, its token) ends a call it holds
    the way the adapter ends a hang-up, and vLLM aborts it by that adapter's path; the client
    gets 499, or its stream ends."""
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle")
    call_id = uuid.uuid4().hex
    front = served.fronts[mode]
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2000, "stream": stream,
            **IGNORE_EOS}  # fmt: skip
    auth = {"Authorization": f"Bearer {serve_fronts.TOKEN}"}
    async with aiohttp.ClientSession() as session:
        post = asyncio.ensure_future(
            session.post(front.url() + "/v1/completions", json=body,
                         headers={"X-Request-Id": call_id})
        )  # fmt: skip

        def decoding() -> bool:
            return total(served.samples(), "vllm:num_requests_running") > 0

        await asyncio.to_thread(poll_until, decoding, WAIT_S, "the call running in vLLM")
        url = f"{front.url()}/v2/requests/{call_id}/cancel"
        async with session.post(url, headers=auth) as answer:
            assert (answer.status, await answer.json()) == (
                200, {"request_id": call_id, "state": "cancelled"}
            )  # fmt: skip
        async with await post as response:
            if mode == "close" and not stream:
                assert response.status == 499  # the sidecar's: nothing had been sent
            with contextlib.suppress(aiohttp.ClientPayloadError):
                await response.read()  # ended by vLLM (abort), or cut (close)
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle again")
    await asyncio.to_thread(poll_until, lambda: served.aborted(call_id), 10, "vLLM's abort log")
    assert served.aborted_by_endpoint(call_id) is (mode == "abort"), call_id


async def test_a_client_of_vllm_pr_55521_cancels_by_the_answers_own_id_and_by_group(
    served: Served,
) -> None:
    """``vllm serve`` 0.32 has none of PR 55521's paths: the sidecar answers them itself, with
    its token. A streaming client that set no ``X-Request-Id`` cancels by the ``id`` of its first
    event (``cmpl-…``, Rapid-MLX issue 2342), and vLLM aborts it; the same cancel again is the
    PR's 404; two calls of one job (``X-Hangup-Group``) end with one group cancel."""
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle")
    front = served.fronts["abort"]
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2000, "stream": True, **IGNORE_EOS}
    auth = {"Authorization": f"Bearer {serve_fronts.TOKEN}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(front.url() + "/v1/completions", json=body) as resp:
            first = await resp.content.readline()
            answer_id = json.loads(first.decode()[6:])["id"]
            assert answer_id.startswith("cmpl-")
            url = f"{front.url()}/v1/requests/{answer_id}/cancel"
            async with session.post(url) as refused:
                assert refused.status == 401
            async with session.post(url, headers=auth) as answer:
                assert (answer.status, await answer.json()) == (
                    200, {"status": "cancelled", "request_id": answer_id, "state": "cancelled"}
                )  # fmt: skip
            with contextlib.suppress(aiohttp.ClientPayloadError):
                await resp.read()  # ended by vLLM's abort
        await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle again")
        async with session.delete(f"{front.url()}/v1/requests/{answer_id}", headers=auth) as again:
            assert again.status == 404
        job = {"X-Hangup-Group": f"job-{uuid.uuid4().hex}"}
        streams = [await session.post(front.url() + "/v1/completions", json=body, headers=job)
                   for _ in range(2)]  # fmt: skip
        for resp in streams:
            await resp.content.readline()
        group = job["X-Hangup-Group"]
        async with session.post(f"{front.url()}/v2/groups/{group}/cancel", headers=auth) as ended:
            assert len((await ended.json())["cancelled_request_ids"]) == 2
        for resp in streams:
            with contextlib.suppress(aiohttp.ClientPayloadError):
                await resp.read()
            resp.close()
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle at last")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_hang_up_while_queued_leaves_the_queue(
    served: Served, mode: str, stream: bool
) -> None:
    """Eight long calls fill vLLM's batch (direct); the ninth, through the proxy, waits; its
    hang-up empties the queue while the eight keep running."""
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle")
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3000, "stream": True, **IGNORE_EOS}
    async with aiohttp.ClientSession() as session:
        fillers = [
            await session.post(served.url + "/v1/completions", json=body) for _ in range(BATCH)
        ]
        try:
            await asyncio.to_thread(
                poll_until,
                lambda: total(served.samples(), "vllm:num_requests_running") == BATCH,
                WAIT_S,
                "a full batch",
            )
            call_id = uuid.uuid4().hex
            queued = asyncio.ensure_future(session.post(
                served.fronts[mode].url() + "/v1/completions", json={**body, "stream": stream},
                headers={"X-Request-Id": call_id},
            ))  # fmt: skip
            await asyncio.to_thread(
                poll_until,
                lambda: total(served.samples(), "vllm:num_requests_waiting") == 1,
                WAIT_S,
                "the ninth call queued",
            )
            leave(queued)
            await asyncio.to_thread(
                poll_until,
                lambda: (
                    (s := served.samples())
                    and total(s, "vllm:num_requests_waiting") == 0
                    and total(s, "vllm:num_requests_running") == BATCH
                ),
                WAIT_S,
                "the queue empty, the batch still running",
            )
            await asyncio.to_thread(poll_until, lambda: served.aborted(call_id), 10, "the log")
            assert served.aborted_by_endpoint(call_id) is (mode == "abort")
            assert served.aborted_on_disconnect(call_id) is (mode == "close")
        finally:
            for response in fillers:
                response.close()
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle again")


@pytest.mark.parametrize("mode", MODES)
async def test_a_soak_of_concurrent_hang_ups_leaves_nothing_running(
    served: Served, mode: str
) -> None:
    """120 calls, 12 at a time (more than the batch: some wait in vLLM's queue), half of them
    hanging up at a random moment, streaming and not. Every hung-up call vLLM received is
    aborted there; every other call completes; vLLM ends idle."""
    rng = random.Random(f"soak-{mode}")
    front = served.fronts[mode]
    cancelled_before = proxy_count(front, "hangup_proxy_requests_total", outcome="cancelled")
    gate = asyncio.Semaphore(12)
    hung_up: list[str] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        hangs_up = rng.random() < 0.5
        stream = rng.random() < 0.5
        call_id = f"soak{i}x{uuid.uuid4().hex[:8]}"
        body = {"model": MODEL, "prompt": "Once upon a time", "stream": stream,
                "max_tokens": 2000 if hangs_up else 12, **IGNORE_EOS}  # fmt: skip
        async with gate:
            post = session.post(
                front.url() + "/v1/completions", json=body, headers={"X-Request-Id": call_id}
            )
            if not hangs_up:
                async with post as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                return
            task = asyncio.ensure_future(post)
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            leave(task)
            hung_up.append(call_id)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i) for i in range(120)))
    await asyncio.to_thread(poll_until, served.idle, WAIT_S, "vLLM idle after the soak")
    received = [c for c in hung_up if served.received(c)]
    assert len(received) > len(hung_up) * 0.8, (len(received), len(hung_up))
    missing = [c for c in received if not served.aborted(c)]  # vLLM was idle: all logged
    assert not missing, f"vLLM never aborted {missing}"
    cancelled = proxy_count(front, "hangup_proxy_requests_total", outcome="cancelled")
    assert cancelled - cancelled_before == len(hung_up)
