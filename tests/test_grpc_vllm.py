"""gRPC with the real vLLM engine (tiny local model): Triton's client, through the proxy.

The shared two-worker vLLM gateway and the shared proxy in front of it
(``tests/vllm_fixtures.py``). The engines must end every test idle: no request running or
waiting, the KV cache empty, which is what an abort that reached vLLM looks like from outside.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton

from tests.support import Process, metric_sum, poll_until

# The vLLM session fixtures come with the vLLM engine's tests (tests/vllm_fixtures.py).
vllm_fixtures = pytest.importorskip("tests.vllm_fixtures", reason="needs the vLLM test fixtures")
calls_in_flight = vllm_fixtures.calls_in_flight

pytestmark = [pytest.mark.vllm, vllm_fixtures.requires_vllm]

MODEL = "tiny"
WAIT = 60.0


def metric(proc: Process, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    return metric_sum(proc.url(), name, labels)


def until(predicate: Callable[[], bool], what: str) -> None:
    poll_until(predicate, WAIT, what)


def engines_idle(gateway: Process) -> bool:
    busy = metric(gateway, "hangup_gateway_engine_running_requests")
    busy += metric(gateway, "hangup_gateway_engine_waiting_requests")
    return not busy and not metric(gateway, "hangup_gateway_engine_kv_cache_usage_ratio")


@pytest.fixture
def proxy(vllm_proxy: Process) -> Process:
    """The shared proxy in front of the shared vLLM gateway (HTTP and gRPC)."""
    return vllm_proxy


@pytest.fixture
def gateway(vllm_gateway2: Process) -> Process:
    """The shared vLLM gateway, idle before the test."""
    until(lambda: engines_idle(vllm_gateway2), "the engines to be idle")
    return vllm_gateway2


def inputs(prompt: str, *, stream: bool, **sampling: Any) -> list[triton.InferInput]:
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    flag = triton.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    params = triton.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return [text, flag, params]


def text_of(result: Any) -> str:
    output = result.as_numpy("text_output")
    return "" if output is None else b"".join(output).decode()


def test_grpc_answers_what_http_answers(gateway: Process, proxy: Process) -> None:
    sampling = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    client = triton.InferenceServerClient(proxy.listeners["grpc"])
    try:
        unary = text_of(client.infer(MODEL, inputs("Hello there", stream=False, **sampling)))
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, inputs("Hello there", stream=True, **sampling),
                                  request_id="s")  # fmt: skip
        pieces = []
        while True:
            result, error = results.get(timeout=WAIT)
            assert error is None, error
            pieces.append(text_of(result))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    finally:
        client.close()
    body = json.dumps({"text_input": "Hello there", **sampling}).encode()
    request = urllib.request.Request(gateway.url() + f"/v2/models/{MODEL}/generate", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=WAIT) as resp:
        expected = json.load(resp)["text_output"]
    assert unary == expected
    assert "Hello there" + "".join(pieces) == expected


def test_stop_stream_aborts_every_request_in_vllm(gateway: Process, proxy: Process) -> None:
    before = metric(gateway, "hangup_gateway_cancellations_total", reason="grpc_cancelled")
    client = triton.InferenceServerClient(proxy.listeners["grpc"])
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for name in ("a", "b", "c"):
            client.async_stream_infer(
                MODEL, inputs(f"Tell me about {name}", stream=True, max_tokens=4000,
                              ignore_eos=True), request_id=name,
            )  # fmt: skip
        started = set()
        while len(started) < 3:
            result, error = results.get(timeout=WAIT)
            assert error is None, error
            started.add(result.get_response().id)
        client.stop_stream(cancel_requests=True)
        until(
            lambda: (
                metric(gateway, "hangup_gateway_cancellations_total", reason="grpc_cancelled")
                == before + 3
            ),
            "three grpc_cancelled aborts",
        )
        until(lambda: not calls_in_flight(gateway), "no call left in flight")
        until(lambda: engines_idle(gateway), "vLLM idle, its KV cache freed")
    finally:
        client.close()
