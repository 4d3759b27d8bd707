"""The vLLM tier's fixtures: the tiny local model, one two-worker vLLM gateway and a proxy in
front of it, shared by the session (see ``tests/support/vllm_stack.py``)."""

from __future__ import annotations

import pytest

from tests.support.processes import Process
from tests.support.vllm_stack import (  # noqa: F401 (fixtures)
    WAIT_S,
    client_for,
    engines_idle,
    tiny_model,
    vllm_gateway2,
    vllm_proxy,
)
from tests.support.waiting import poll_until


@pytest.fixture
def gateway(vllm_gateway2: Process) -> Process:  # noqa: F811 (the fixture, by name)
    """The shared vLLM gateway, checked idle before the test (a KV-cache baseline of zero)."""
    poll_until(lambda: engines_idle(vllm_gateway2), WAIT_S, "the engines to be idle")
    return vllm_gateway2
