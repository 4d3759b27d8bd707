"""Worker roles (``--worker-roles``): what the flag accepts, what it refuses, and where each leg
of a disaggregated call is routed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_server.config import from_args
from gateway_server.engine.base import EngineError, NoLiveWorker
from gateway_server.engine.handoff import WorkerRole
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.engine.vllm.kv_handoff import HandoffStore
from gateway_server.engine.vllm.options import VllmOptions
from gateway_server.engine.vllm.pd import vllm_pd_engine_factory
from hangup_contract.runtime.options import ConfigError

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH


def test_every_worker_serves_whole_requests_by_default() -> None:
    config = from_args(["--workers", "3"], {})
    assert config.roles == (B, B, B)


def test_roles_come_from_the_flag_or_the_environment() -> None:
    flag = from_args(["--workers", "3", "--worker-roles", "prefill, decode,decode"], {})
    env = from_args(["--workers", "2"], {"HANGUP_GATEWAY_WORKER_ROLES": "both,decode"})
    assert flag.roles == (P, D, D)
    assert env.roles == (B, D)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2", "--worker-roles", "prefill"], "1 worker roles given for 2 workers"),
        (["--workers", "2", "--worker-roles", "prefill,encode"], "unknown worker role 'encode'"),
        (["--workers", "2", "--worker-roles", "decode,decode"], "no worker can prefill"),
        (["--workers", "2", "--worker-roles", "prefill,prefill"], "no worker can decode"),
        (
            ["--workers", "2", "--api-processes", "2", "--worker-roles", "prefill,decode"],
            "not supported",
        ),
    ],
)
def test_roles_that_cannot_serve_are_refused_by_name(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_args(argv, {})


def test_vllm_workers_take_roles_and_a_kv_connector() -> None:
    argv = "--engine vllm --model m --workers 2 --worker-roles prefill,decode".split()
    argv += ["--kv-connector", "NixlConnector"]
    config = from_args(argv, {})
    assert [r.value for r in config.roles] == ["prefill", "decode"]
    assert config.engine_settings.kv_connector == "NixlConnector"
    assert from_args(argv[:-2], {}).engine_settings.kv_connector == "hangup"


async def test_each_leg_goes_to_the_least_loaded_worker_of_its_role() -> None:
    engines = [SimulatedEngine(SimConfig()) for _ in range(4)]
    pool = EnginePool(engines, roles=(P, D, D, B))
    await pool.start()
    try:
        assert pool.disaggregated
        prefills = [pool.acquire(P).index for _ in range(3)]
        decodes = [pool.acquire(D).index for _ in range(5)]
        assert prefills == [0, 3, 0]  # the both worker takes its turn
        assert decodes == [1, 2, 1, 2, 3]  # worker 3 runs a prefill leg: it counts
        assert pool.ready
        engines[0].inject_fault("kill")
        engines[3].inject_fault("kill")
        with pytest.raises(NoLiveWorker, match="no engine worker that can prefill is alive"):
            pool.acquire(P)
        assert not pool.ready  # decode workers alone cannot serve a call
    finally:
        await pool.shutdown()


def test_an_aggregated_pool_is_not_disaggregated() -> None:
    pool = EnginePool([SimulatedEngine(SimConfig())])
    assert not pool.disaggregated and pool.workers[0].role is B


def test_an_unknown_kv_connector_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="--kv-connector 'Lmcache' is not known"):
        vllm_pd_engine_factory("m", VllmOptions(kv_connector="Lmcache"), 2, HandoffStore(tmp_path))
