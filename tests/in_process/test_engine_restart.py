"""A dead engine comes back: the simulated engine's fault switch kills a worker (as SIGKILL kills
a vLLM engine core) and the gateway starts it again; what clients, cancel callers, probes and
metrics see meanwhile. Liveness fails only when an engine cannot be brought back, or the event
loop stalls."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.base import Engine, NoFaults
from gateway_server.engine.pool import RestartPolicy
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.metrics.gateway import worker_loads
from tests.support.gateway import MODEL, Gateway, running_gateway

TOKEN = "fault-token"
FAST = SimConfig(step_base_s=0.002)


@pytest.fixture
async def two_workers() -> AsyncIterator[Gateway]:
    async with running_gateway(sim=FAST, token=TOKEN, workers=2, sim_faults=True) as gw:
        yield gw


async def fault(gw: Gateway, worker: str, kind: str, token: str | None = TOKEN) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{gw.url}/v2/admin/workers/{worker}/fault"
    async with gw.session.post(url, json={"fault": kind}, headers=headers) as resp:
        await resp.read()
        return resp.status


async def start_stream(gw: Gateway, rid: str) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "stream": True}
    resp = await gw.session.post(
        f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": rid}
    )
    assert resp.status == 200, await resp.text()
    await resp.content.readline()  # a token arrived: it runs
    return resp


async def events(resp: aiohttp.ClientResponse) -> list[str]:
    return [line.decode()[6:].strip() async for line in resp.content if line.startswith(b"data: ")]


async def next_event(resp: aiohttp.ClientResponse) -> bytes:
    """The next ``data:`` line of a stream (b"" once it ended)."""
    while line := await resp.content.readline():
        if line.startswith(b"data: "):
            return line
    return b""


async def status_of(gw: Gateway, path: str) -> tuple[int, Any]:
    async with gw.session.get(gw.url + path) as resp:
        return resp.status, await resp.json()


def up(gw: Gateway, worker: str) -> float:
    loads = {w.name: w for w in worker_loads(gw.server.pool)}
    return 1.0 if loads[worker].up else 0.0


def worker_of(gw: Gateway, rid: str) -> str:
    call = next(c for c in gw.server.registry.calls() if c.call_id == rid)
    return next(iter(call.requests.values())).placement.worker.name


async def test_a_killed_worker_fails_its_streams_clearly_and_serves_again(
    two_workers: Gateway,
) -> None:
    gw = two_workers
    doomed = await start_stream(gw, "doomed")
    victim = worker_of(gw, "doomed")
    healthy = await start_stream(gw, "healthy")  # the least-loaded worker: the other one
    assert worker_of(gw, "healthy") != victim
    old_engine = gw.server.pool.workers[int(victim)].engine

    assert await fault(gw, victim, "kill") == 200
    ended = await events(doomed)
    assert "[DONE]" not in ended
    error = json.loads(ended[-1])["error"]
    assert error["type"] == "engine_error" and f"engine worker {victim}" in error["message"]
    assert "killed" in error["message"]
    # Its cancel answers as for an ended request, at once.
    async with asyncio.timeout(5):
        status, body = await gw.cancel("doomed")
    assert (status, body["state"]) == (200, "finished")

    await wait_until(lambda: gw.metric("hangup_gateway_engine_restarts_total", worker=victim),
                     what="the restart to be counted")  # fmt: skip
    assert gw.server.pool.workers[int(victim)].engine is not old_engine
    assert up(gw, victim) == 1.0
    # The other worker's stream never noticed; the restarted worker serves new calls.
    assert await next_event(healthy)
    healthy.close()
    again = await start_stream(gw, "again")
    assert worker_of(gw, "again") == victim
    again.close()
    await wait_until(lambda: not len(gw.server.registry), what="nothing in flight")
    other = str(1 - int(victim))
    assert gw.metric("hangup_gateway_engine_restarts_total", worker=other) == 0


async def test_while_a_worker_is_down_the_other_serves_and_its_gauges_read_idle(
    two_workers: Gateway,
) -> None:
    gw = two_workers
    held = asyncio.Event()
    pool = gw.server.pool
    make = pool.factory
    assert make is not None
    pool.factory = lambda index: cast(Engine, _HeldEngine(make(index), held))

    stream = await start_stream(gw, "s")
    victim = worker_of(gw, "s")
    assert await fault(gw, victim, "kill") == 200
    await events(stream)
    await wait_until(lambda: pool.workers[int(victim)].down_since, what="the worker seen down")
    dead = pool.workers[int(victim)].engine
    assert dead.load().running == 1, "the dead engine's last statistics: a running stream"
    loads = {w.name: w for w in worker_loads(gw.server.pool)}
    assert loads[victim].up is False
    assert (loads[victim].running, loads[victim].waiting, loads[victim].kv) == (0, 0, 0.0)
    assert (await status_of(gw, "/v2/health/ready"))[0] == 200  # the other worker serves
    assert (await status_of(gw, "/v2/health/live"))[0] == 200
    for rid in ("a", "b"):  # both on the live worker
        s = await start_stream(gw, rid)
        assert worker_of(gw, rid) != victim
        s.close()
    held.set()
    await wait_until(lambda: up(gw, victim), what="the worker back up")


async def test_one_worker_down_means_not_ready_and_live_until_the_down_limit() -> None:
    """Readiness is 503 while no worker serves; liveness turns 503 only once the worker has been
    down past --engine-down-limit, and 200 again once it serves."""
    async with running_gateway(
        sim=FAST, token=TOKEN, sim_faults=True, engine_down_limit=2.0,
        engine_restart_backoff=0.05, engine_restart_backoff_max=0.1,
    ) as gw:  # fmt: skip
        pool = gw.server.pool
        make = pool.factory
        assert make is not None
        failing = True

        def factory(index: int) -> Engine:
            return cast(Engine, _FailingEngine()) if failing else make(index)

        pool.factory = factory
        assert await fault(gw, "0", "kill") == 200
        await wait_until(lambda: pool.workers[0].down_since, what="the worker seen down")
        status, body = await status_of(gw, "/v2/health/ready")
        assert status == 503 and body["ready"] is False
        async with gw.session.post(f"{gw.url}/v1/completions",
                                   json={"model": MODEL, "prompt": "x"}) as resp:  # fmt: skip
            assert resp.status == 503
            assert "no engine worker is alive" in (await resp.json())["error"]["message"]
        assert (await status_of(gw, "/v2/health/live"))[0] == 200  # not yet past the limit

        async def live_fails() -> Any:
            status, body = await status_of(gw, "/v2/health/live")
            return status == 503 and body

        body = await wait_until(live_fails, what="liveness to fail")
        assert "could not be started again" in body["error"]
        assert pool.down_for() > 2.0
        failing = False
        await wait_until(lambda: up(gw, "0"), what="the worker back up")
        assert (await status_of(gw, "/v2/health/ready"))[0] == 200
        assert (await status_of(gw, "/v2/health/live"))[0] == 200
        assert gw.metric("hangup_gateway_engine_restarts_total", worker="0") == 1


async def test_a_stalled_event_loop_fails_liveness_for_a_while() -> None:
    async with running_gateway(sim=FAST, loop_stall_limit=1.0) as gw:
        assert (await status_of(gw, "/v2/health/live"))[0] == 200
        time.sleep(2.5)  # noqa: ASYNC251 (the fault under test: a handler blocking the loop)
        status, body = await status_of(gw, "/v2/health/live")
        assert status == 503 and "event loop stalled" in body["error"]
        await wait_until(
            lambda: _status_is(gw, "/v2/health/live", 200), what="liveness back once it runs"
        )


async def test_a_short_stall_is_logged_with_its_stack_and_length_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hangup.gateway")
    async with running_gateway(sim=FAST, loop_stall_limit=10.0, loop_stall_log=0.3) as gw:
        time.sleep(1.0)  # noqa: ASYNC251 (the fault under test: a handler blocking the loop)
        assert (await status_of(gw, "/v2/health/live"))[0] == 200  # short of the limit

        def logged(name: str) -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage() == name]

        await wait_until(lambda: logged("event_loop_resumed"), what="the stall's end logged")
        (stalled,) = logged("event_loop_stalled")
        assert stalled.levelno == logging.WARNING
        assert "test_a_short_stall_is_logged" in stalled.fields["stack"]  # type: ignore[attr-defined]
        (resumed,) = logged("event_loop_resumed")
        assert 0.7 <= resumed.fields["stalled_s"] <= 1.5  # type: ignore[attr-defined]
        assert gw.metric("hangup_gateway_event_loop_stalls_total") == 1


async def _status_is(gw: Gateway, path: str, expected: int) -> bool:
    return (await status_of(gw, path))[0] == expected


async def test_the_fault_switch_needs_the_flag_and_the_token() -> None:
    async with running_gateway(sim=FAST, token=TOKEN) as gw:
        assert await fault(gw, "0", "kill") == 404  # no --sim-faults: no such route
        assert gw.server.pool.ready
    async with running_gateway(sim=FAST, token=TOKEN, sim_faults=True) as gw:
        assert await fault(gw, "0", "kill", token=None) == 401
        assert await fault(gw, "0", "explode") == 400
        assert await fault(gw, "7", "kill") == 404
        assert gw.server.pool.ready
    # an engine that takes no faults (vLLM's) is no worker the switch can reach
    engines: list[Engine] = [_NoFaultsEngine(SimulatedEngine(FAST))]
    async with running_gateway(token=TOKEN, sim_faults=True, engines=engines) as gw:
        assert await fault(gw, "0", "kill") == 404
        assert gw.server.pool.ready


async def test_a_hung_worker_stops_and_resumes() -> None:
    async with running_gateway(sim=FAST, token=TOKEN, sim_faults=True) as gw:
        stream = await start_stream(gw, "h")
        assert await fault(gw, "0", "hang") == 200
        engine = gw.server.pool.workers[0].engine
        assert isinstance(engine, SimulatedEngine)
        before = engine.steps
        await asyncio.sleep(0.1)  # a window to show that nothing happens: 50 steps' worth
        assert engine.steps == before, "a hung engine took steps"
        assert engine.alive  # hung, not dead: nothing restarts it
        assert await fault(gw, "0", "resume") == 200
        assert await next_event(stream)
        stream.close()


def test_restart_backoff_is_at_once_then_doubling_to_the_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, backoff_max_s=3.0)
    assert [policy.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


class _HeldEngine:
    """A new engine whose start waits for ``held`` (a restart that takes a while)."""

    def __init__(self, engine: Engine, held: asyncio.Event) -> None:
        self._engine = engine
        self._held = held

    async def start(self) -> None:
        await self._held.wait()
        await self._engine.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _NoFaultsEngine:
    """A working engine that takes no injected faults, as the vLLM engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def inject_fault(self, fault: str) -> None:
        raise NoFaults("this engine takes no injected faults")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _FailingEngine:
    """A new engine that cannot start (the device is gone, the model cannot load)."""

    async def start(self) -> None:
        raise RuntimeError("device lost")

    async def shutdown(self) -> None:
        return None
