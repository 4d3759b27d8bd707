from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.gateway_fixtures import Gateway, running_gateway

# The real vLLM engine's session fixtures (tiny local model, a shared two-worker gateway, a
# proxy in front of it).
from tests.vllm_fixtures import client_for, tiny_model, vllm_gateway2, vllm_proxy  # noqa: F401


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    """A gateway with the simulated engine's defaults (8 slots, 10 ms steps)."""
    async with running_gateway() as gw:
        yield gw
