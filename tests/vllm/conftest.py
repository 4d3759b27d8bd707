"""The vLLM tier's fixtures: the tiny local model, one two-worker vLLM gateway and a proxy in
front of it, shared by the session (see ``tests/support/vllm_stack.py``). No test kills the
shared gateway's engines, so one that died fails the test it died in, with why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import Process, log_events
from tests.support.scrape import scrape, total
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


@pytest.fixture(autouse=True)
def no_engine_died(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the shared gateway: none of its engines died (the gateway starts a
    dead one again, so a test could pass while its requests failed, and the next see a fresh
    engine)."""
    yield
    if "vllm_gateway2" not in request.fixturenames:
        return
    shared: Process = request.getfixturevalue("vllm_gateway2")
    restarts = total(scrape(shared.url()), "hangup_gateway_engine_restarts_total")
    died = log_events(shared, "engine_worker_died")
    assert not restarts and not died, f"an engine of the shared gateway died: {died}"
