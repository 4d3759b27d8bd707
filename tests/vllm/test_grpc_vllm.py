"""gRPC with the real vLLM engine (tiny local model): Triton's client, through the proxy.

The shared two-worker vLLM gateway and the shared proxy in front of it
(``bench/harness/vllm_stack.py``). The engines must end every test idle: no request running or
waiting, the KV cache empty, which is what an abort that reached vLLM looks like from outside.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from typing import Any

import pytest
import tritonclient.grpc as triton

from bench.base.processes import Process
from bench.base.scrape import metric_sum
from bench.base.waiting import poll_until
from bench.harness.triton.io import inputs, is_final, text_of
from bench.harness.vllm_stack import MODEL, WAIT_S, calls_in_flight, engines_idle
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_grpc_answers_what_http_answers(gateway: Process, vllm_proxy: Process) -> None:
    sampling = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    client = triton.InferenceServerClient(vllm_proxy.listeners["grpc"])
    try:
        unary = text_of(client.infer(MODEL, inputs("Hello there", stream=False, **sampling)))
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, inputs("Hello there", stream=True, **sampling),
                                  request_id="s")  # fmt: skip
        pieces = []
        while True:
            result, error = results.get(timeout=WAIT_S)
            assert error is None, error
            pieces.append(text_of(result) or "")
            if is_final(result):
                break
        client.stop_stream()
    finally:
        client.close()
    body = json.dumps({"text_input": "Hello there", **sampling}).encode()
    request = urllib.request.Request(gateway.url() + f"/v2/models/{MODEL}/generate", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=WAIT_S) as resp:
        expected = json.load(resp)["text_output"]
    assert unary == expected
    assert "Hello there" + "".join(pieces) == expected


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=WAIT_S) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer


def test_kserve_reads_sampling_fields_as_the_openai_api_does(
    gateway: Process, vllm_proxy: Process
) -> None:
    """Fields KServe once ignored reach vLLM: its answer is the OpenAI API's, over HTTP and gRPC,
    seeded sampling with top_k, min_p, a penalty, min_tokens and a bias that picks every token."""
    sampling = {"max_tokens": 8, "seed": 11, "temperature": 1.0, "top_k": 5, "min_p": 0.05,
                "repetition_penalty": 1.3, "min_tokens": 8, "logit_bias": {"100": 100}}  # fmt: skip
    completion = _post(gateway.url() + "/v1/completions",
                       {"model": MODEL, "prompt": "Hello there", **sampling})  # fmt: skip
    expected = completion["choices"][0]["text"]
    generated = _post(gateway.url() + f"/v2/models/{MODEL}/generate",
                      {"text_input": "Hello there", "parameters": sampling})  # fmt: skip
    assert generated["text_output"] == "Hello there" + expected
    client = triton.InferenceServerClient(vllm_proxy.listeners["grpc"])
    try:
        unary = text_of(client.infer(MODEL, inputs("Hello there", stream=False, **sampling)))
    finally:
        client.close()
    assert unary == "Hello there" + expected
    plain = _post(gateway.url() + f"/v2/models/{MODEL}/generate",
                  {"text_input": "Hello there", "max_tokens": 8, "seed": 11})  # fmt: skip
    assert plain["text_output"] != generated["text_output"]  # the fields changed the answer


def test_stop_stream_aborts_every_request_in_vllm(gateway: Process, vllm_proxy: Process) -> None:
    before = metric_sum(
        gateway.url(), "hangup_gateway_cancellations_total", reason="grpc_cancelled"
    )
    client = triton.InferenceServerClient(vllm_proxy.listeners["grpc"])
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
            result, error = results.get(timeout=WAIT_S)
            assert error is None, error
            started.add(result.get_response().id)
        client.stop_stream(cancel_requests=True)
        poll_until(
            lambda: (
                metric_sum(
                    gateway.url(), "hangup_gateway_cancellations_total", reason="grpc_cancelled"
                )
                == before + 3
            ),
            WAIT_S,
            "three grpc_cancelled aborts",
        )
        poll_until(lambda: not calls_in_flight(gateway), WAIT_S, "no call left in flight")
        poll_until(lambda: engines_idle(gateway), WAIT_S, "vLLM idle, its KV cache freed")
    finally:
        client.close()
