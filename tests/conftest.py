"""Fixtures every tier shares. The tiers are folders: ``pure/`` (framing and rules, no I/O),
``tooling/`` (the benchmarks', the image's and the suite's own machinery, not the product),
``in_process/`` (real servers on 127.0.0.1 in the test's event loop), ``multi_process/`` (the real
``python -m gateway_server`` and ``python -m proxy`` processes), ``hostile/`` (hostile input within
a CPU budget, attacks on live processes), ``deploy/`` (chart, image, observability), ``triton/`` (a
real Triton) and ``vllm/`` (the real engine; its own conftest adds the vLLM session fixtures and
makes ``gateway`` the shared vLLM gateway). Helpers live in ``tests/support/``. A socket a test
leaves open fails that test (``tests/support/leaks.py``), and so does an environment variable it
leaves changed (``tests/support/environment.py``). A test skips only for a thing this machine lacks
(``Unavailable``), every skip is listed at the end, and under ``--require-all`` (CI) each one is a
failure (``tests/support/skips.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import tritonclient.grpc.aio as triton

from bench.harness.stack import RawClients
from tests.support.gateway import Gateway, running_gateway
from tests.support.scripted_upstream import ScriptedUpstream

pytest_plugins = ["tests.support.leaks", "tests.support.environment", "tests.support.skips"]


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    """A gateway with the simulated engine's defaults (8 slots, 10 ms steps)."""
    async with running_gateway() as gw:
        yield gw


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[triton.InferenceServerClient]:
    """Triton's aio gRPC client on the in-process gateway."""
    c = triton.InferenceServerClient(gateway.server.listeners["grpc"])
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    """The scripted upstream the proxy's adapter tests relay to (see its module)."""
    scripted = ScriptedUpstream()
    await scripted.start()
    yield scripted
    await scripted.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client that leaves bodies as sent (no decompression)."""
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        yield client


@pytest.fixture
async def raw() -> AsyncIterator[RawClients]:
    """Raw client connections (``raw.open(url, request_bytes)``), closed when the test ends."""
    clients = RawClients()
    try:
        yield clients
    finally:
        await clients.close()
