"""Triton's own clients, through hangup's proxy, to the gateway: real processes on 127.0.0.1:0.

The sync client (``tritonclient.grpc``) is the one that can ask for the empty final response
(the aio client refuses ``triton_``-prefixed parameters); the aio client's iterator cancel is
checked too. What the gateway recorded is read from its ``/metrics`` and ``/v2/requests``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import queue
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from bench.base.processes import Process, child_env, spawn
from bench.base.scrape import metric_sum
from bench.base.waiting import poll_until, wait_until
from bench.harness.triton.io import inputs, is_final, text_of
from proxy.grpc.peer import can_tell_disconnects
from tests.support.gateway import LONG, MODEL

needs_sock_diag = pytest.mark.skipif(
    not can_tell_disconnects(), reason="needs Linux sock_diag to tell a disconnect from a cancel"
)
TOKEN = "grpc-test-token"
WAIT = 15.0


@dataclass
class Stack:
    gateway: Process
    proxy: Process

    @property
    def target(self) -> str:
        return self.proxy.listeners["grpc"]

    def gateway_metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.gateway.url("http"), name, **labels)

    def proxy_metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.proxy.url("admin"), name, **labels)

    def cancellations(self, reason: str) -> float:
        return self.gateway_metric("hangup_gateway_cancellations_total", reason=reason)

    def gateway_request(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            self.gateway.url("http") + path, method=method,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as resp:
            answer: dict[str, Any] = json.load(resp)
            return answer

    def in_flight(self) -> int:
        return len(self.gateway_request("GET", "/v2/requests")["requests"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("grpc-stack")
    token = tmp / "token"
    token.write_text(TOKEN)
    auth = ["--cancel-token-file", str(token)]
    gateway_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", *auth]
    with spawn("gateway_server", gateway_args, tmp / "gateway") as gateway:
        proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                      "--upstream-http", gateway.url("http"),
                      "--upstream-grpc", gateway.listeners["grpc"], *auth]  # fmt: skip
        with spawn("proxy", proxy_args, tmp / "proxy") as proxy:
            yield Stack(gateway, proxy)


class SyncStream:
    """The sync client's stream; results arrive on gRPC's thread and are read from a queue."""

    def __init__(self, stack: Stack) -> None:
        self.client = triton.InferenceServerClient(stack.target)
        self.results: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, request_id: str, prompt: str, **options: Any) -> None:
        empty_final = options.pop("empty_final", False)
        stream = options.pop("stream", True)
        self.client.async_stream_infer(
            MODEL, inputs(prompt, stream=stream, **options), request_id=request_id,
            enable_empty_final_response=empty_final,
        )  # fmt: skip

    def next(self) -> tuple[Any, InferenceServerException | None]:
        return self.results.get(timeout=WAIT)

    def until_final(self, request_id: str) -> list[Any]:
        mine: list[Any] = []
        while not (mine and is_final(mine[-1])):
            result, error = self.next()
            assert error is None, error
            if result.get_response().id == request_id:
                mine.append(result)
        return mine

    def close(self, cancel_requests: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel_requests)
        self.client.close()


def test_empty_final_response_only_when_asked_for(stack: Stack) -> None:
    stream = SyncStream(stack)
    try:
        stream.send("asked", "Hello", max_tokens=4, empty_final=True)
        asked = stream.until_final("asked")
        stream.send("plain", "Hello", max_tokens=4)
        plain = stream.until_final("plain")
    finally:
        stream.close()
    *data, last = asked
    assert data and all(text_of(r) and not is_final(r) for r in data)
    assert text_of(last) is None and is_final(last)
    assert [is_final(r) for r in plain] == [False] * (len(plain) - 1) + [True]
    assert text_of(plain[-1])  # the last data response carries the flag itself
    assert "".join(text_of(r) or "" for r in data) == "".join(text_of(r) or "" for r in plain)


def test_stop_stream_with_cancel_requests_aborts_every_request(stack: Stack) -> None:
    before = stack.cancellations("grpc_cancelled")
    explicit = stack.proxy_metric(
        "hangup_proxy_cancel_calls_total", adapter="hangup_grpc", result="ok"
    )
    stream = SyncStream(stack)
    for name in ("a", "b", "c"):
        stream.send(name, f"long {name}", max_tokens=LONG, ignore_eos=True)
    started = set()
    while len(started) < 3:
        result, error = stream.next()
        assert error is None, error
        started.add(result.get_response().id)
    # The client stays up: one that cancels and drops its connection at once may well be
    # counted as a disconnect (see proxy/grpc/peer.py).
    stream.client.stop_stream(cancel_requests=True)
    try:
        poll_until(
            lambda: stack.cancellations("grpc_cancelled") == before + 3, WAIT, "3 grpc_cancelled"
        )
        poll_until(lambda: stack.in_flight() == 0, WAIT, "nothing left in flight on the gateway")
    finally:
        stream.client.close()
    assert (
        stack.proxy_metric("hangup_proxy_cancel_calls_total", adapter="hangup_grpc", result="ok")
        == explicit + 1
    )  # one explicit cancel: the stream's call id covers its three requests


async def test_aio_client_cancelling_its_iterator(stack: Stack) -> None:
    before = stack.cancellations("grpc_cancelled")
    client = triton_aio.InferenceServerClient(stack.target)

    async def requests() -> Any:
        yield {"model_name": MODEL, "inputs": inputs("aio", max_tokens=LONG, ignore_eos=True),
               "request_id": "aio"}  # fmt: skip
        await asyncio.Event().wait()  # the stream stays open until the client cancels it

    try:
        responses = client.stream_infer(requests())
        result, error = await anext(responses)
        assert error is None and text_of(result)
        responses.cancel()
        await wait_async(lambda: stack.cancellations("grpc_cancelled") == before + 1)
    finally:
        await client.close()


async def test_a_stream_past_its_deadline_aborts_its_requests_as_deadline_exceeded(
    stack: Stack,
) -> None:
    before = stack.cancellations("deadline_exceeded")
    client = triton_aio.InferenceServerClient(stack.target)

    async def requests() -> Any:
        for name in ("d1", "d2"):
            yield {"model_name": MODEL, "request_id": name,
                   "inputs": inputs(name, max_tokens=LONG, ignore_eos=True)}  # fmt: skip
        await asyncio.Event().wait()  # the stream stays open until its deadline

    try:
        responses = client.stream_infer(requests(), stream_timeout=1.0)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _, error in responses:
                assert error is None
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_async(lambda: stack.cancellations("deadline_exceeded") == before + 2)
    finally:
        await client.close()


async def wait_async(predicate: Callable[[], bool]) -> None:
    await wait_until(predicate, WAIT)


def test_unary_infer_past_its_deadline_is_aborted_as_deadline_exceeded(stack: Stack) -> None:
    before = stack.cancellations("deadline_exceeded")
    client = triton.InferenceServerClient(stack.target)
    try:
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer(MODEL, inputs("slow", stream=False, max_tokens=LONG, ignore_eos=True),
                         client_timeout=0.5)  # fmt: skip
    finally:
        client.close()
    poll_until(
        lambda: stack.cancellations("deadline_exceeded") == before + 1, WAIT, "deadline_exceeded"
    )
    poll_until(lambda: stack.in_flight() == 0, WAIT, "nothing left in flight on the gateway")


def test_one_request_cancelled_alone_on_a_multiplexed_stream(stack: Stack) -> None:
    stream = SyncStream(stack)
    try:
        stream.send("long", "keep going", max_tokens=LONG, ignore_eos=True)
        first, _ = stream.next()
        cancel_id = first.get_response().parameters["hangup_request_id"].string_param
        stream.send("short1", "one", max_tokens=5)
        stream.send("short2", "two", max_tokens=5)
        answer = stack.gateway_request("POST", f"/v2/requests/{cancel_id}/cancel")
        assert answer["state"] == "cancelled"
        errors, finished = [], set()
        while not (errors and finished == {"short1", "short2"}):
            result, error = stream.next()
            if error is not None:
                errors.append(str(error))
            elif is_final(result):
                finished.add(result.get_response().id)
        assert errors == ["CANCELLED: request cancelled (explicit)"]
        stream.send("after", "the stream is still open", max_tokens=3)
        assert text_of(stream.until_final("after")[0])
    finally:
        stream.close()


def test_malformed_request_is_invalid_argument_and_the_stream_survives(stack: Stack) -> None:
    stream = SyncStream(stack)
    try:
        stream.send("bad", "x", max_tokens=-1)
        _, error = stream.next()
        assert error is not None and str(error).startswith("INVALID_ARGUMENT: 'max_tokens'")
        stream.send("good", "fine", max_tokens=3)
        assert text_of(stream.until_final("good")[0])
    finally:
        stream.close()


@needs_sock_diag
def test_a_client_process_that_dies_is_cancelled_as_a_disconnect(stack: Stack) -> None:
    before = stack.cancellations("client_disconnect")
    # A client that streams, then dies without a word (SIGKILL while it waits).
    script = textwrap.dedent(
        f"""
        import queue, threading, tritonclient.grpc as triton
        from bench.harness.triton.io import inputs
        results = queue.Queue()
        client = triton.InferenceServerClient({stack.target!r})
        client.start_stream(callback=lambda result, error: results.put(error))
        client.async_stream_infer(
            {MODEL!r}, inputs("doomed", max_tokens={LONG}, ignore_eos=True), request_id="doomed"
        )
        assert results.get(timeout=30) is None
        print("streaming", flush=True)
        threading.Event().wait()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=child_env()
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"streaming"
        finally:
            child.kill()
    poll_until(
        lambda: stack.cancellations("client_disconnect") == before + 1, WAIT, "client_disconnect"
    )


def test_health_and_metadata_pass_through_the_proxy(stack: Stack) -> None:
    client = triton.InferenceServerClient(stack.target)
    try:
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        assert client.get_model_config(MODEL).config.model_transaction_policy.decoupled
        assert not client.is_model_ready("other")  # as Triton answers: not ready, no error
        assert [m.name for m in client.get_model_repository_index().models] == [MODEL]
    finally:
        client.close()


async def test_a_status_the_upstream_sends_before_reading_the_request_reaches_the_client(
    stack: Stack,
) -> None:
    # The gateway answers an unknown method at once, while the proxy may still be writing the
    # request upstream; grpc.aio then stamped the proxy's upstream call INTERNAL over the real
    # status (up to 60 % of such calls did, before proxy/grpc/status.py).
    async with grpc.aio.insecure_channel(stack.target) as channel:
        method = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        gate = asyncio.Semaphore(32)

        async def one(size: int) -> grpc.StatusCode:
            async with gate:
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await method(b"x" * size, timeout=WAIT)
                return failed.value.code()

        codes = await asyncio.gather(*(one(size) for size in [0, 1000, 500_000] * 100))
    assert set(codes) == {grpc.StatusCode.UNIMPLEMENTED}, collections.Counter(codes)


def test_sigterm_drains_then_cancels_streams_left_with_reason_shutdown(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("grpc-drain")
    gateway_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0"]
    with spawn("gateway_server", gateway_args, tmp / "gateway") as gateway:
        proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                      "--upstream-http", gateway.url("http"), "--drain-timeout", "0.3",
                      "--upstream-grpc", gateway.listeners["grpc"]]  # fmt: skip
        with spawn("proxy", proxy_args, tmp / "proxy") as proxy:
            stack = Stack(gateway, proxy)
            stream = SyncStream(stack)
            try:
                stream.send("long", "outlives the drain", max_tokens=LONG, ignore_eos=True)
                assert stream.next()[1] is None
                assert proxy.terminate() == 0
                while (ended := stream.next())[1] is None:
                    pass  # the last tokens relayed while draining
                assert "UNAVAILABLE" in str(ended[1]) and "shutting down" in str(ended[1])
            finally:
                stream.client.close()
            poll_until(
                lambda: stack.cancellations("shutdown") == 1,
                WAIT,
                "the gateway to count a shutdown",
            )
            poll_until(
                lambda: stack.in_flight() == 0, WAIT, "nothing left in flight on the gateway"
            )
