"""hangup's sidecar behind the front doors users run, for real (``bench/harness/front_doors.py``:
nginx, HAProxy and Caddy from Debian's packages, Envoy from its wheel), each with the
configuration shipped in ``docs/front-doors/``: a client's hang-up, on a call that streams and on
one that does not, gets through the front door and is a cancellation on the gateway, and a
stream's events get through as they are made. Each front door skips, saying why, where it cannot
run here. The matrix with every stage and the settings each needs: ``bench.front_doors.matrix``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.base.addresses import port_of
from bench.base.processes import Process
from bench.base.waiting import wait_until
from bench.harness.front_doors import FRONT_DOORS, cancelled, hang_up, running_front_door, stack

pytestmark = pytest.mark.slow

CANCELLED_WITHIN_S = 2.0  # the gateway's count after the client's close (seen: 20-40 ms)


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Process]]:
    """A simulated gateway (one slot) and its sidecar."""
    with stack(Path(tmp_path_factory.mktemp("front-doors"))) as (gateway, sidecar):
        yield gateway, sidecar


@pytest.fixture(scope="module", params=FRONT_DOORS)
def front_door(
    request: pytest.FixtureRequest,
    pod: tuple[Process, Process],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    port = port_of(pod[1].url())
    work = Path(tmp_path_factory.mktemp(request.param))
    with running_front_door(request.param, work, port) as url:  # Unavailable: a skip
        yield url


@pytest.mark.parametrize("stage", ["decode", "stream"])
async def test_a_hang_up_gets_through_the_front_door(
    pod: tuple[Process, Process], front_door: str, stage: str
) -> None:
    gateway, _ = pod
    before = cancelled(gateway, "decode")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        started = time.monotonic()
        hung = await hang_up(s, f"{front_door}/v1/chat/completions", stage)
    if stage == "stream":  # three events read, the first at once: not held back
        assert hung.events == 3, hung
        assert time.monotonic() - started < 5 and 0 < hung.first_ms < 1000, hung
    else:  # 2,000 tokens take the gateway seconds: the client left before its answer
        assert hung.events == 0, hung
    await wait_until(lambda: cancelled(gateway, "decode") > before, CANCELLED_WITHIN_S,
                     f"the gateway to cancel the call the client left ({stage})")  # fmt: skip
