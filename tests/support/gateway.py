"""An in-process gateway (simulated engine) on 127.0.0.1:0 for fast tests, and ways to read it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from gateway_server.config import GatewayConfig
from gateway_server.engine.base import Engine
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.metrics.gateway import GatewayMetrics
from gateway_server.registry import CallRegistry
from gateway_server.server import GatewayServer
from gateway_server.service import GenerationService, ModelInfo
from gateway_server.siblings.processes import ApiProcess
from hangup_contract.cancel import cancel_path

MODEL = "hangup-sim"
LONG = 2000
"""Tokens to ask for when a call must outlive the test: 20 s at the default 10 ms a step."""


@dataclasses.dataclass
class Gateway:
    server: GatewayServer
    url: str
    session: aiohttp.ClientSession
    token: str | None

    def metric(self, name: str, **labels: str) -> float:
        """A sample's current value from the gateway's own registry (0 when absent)."""
        registry: CollectorRegistry = self.server.metrics_registry
        return registry.get_sample_value(name, labels) or 0.0

    def cancellations(self, reason: str, phase: str) -> float:
        return self.metric(
            "hangup_gateway_cancellations_total", model=MODEL, reason=reason, phase=phase
        )

    def requests(self, outcome: str, protocol: str = "openai") -> float:
        return self.metric(
            "hangup_gateway_requests_total", model=MODEL, protocol=protocol, outcome=outcome
        )

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def cancel(
        self, request_id: str, reason: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        body = {"reason": reason} if reason else None
        async with self.session.post(
            self.url + cancel_path(request_id), json=body, headers=self.auth()
        ) as resp:
            return resp.status, await resp.json()

    async def in_flight(self) -> dict[str, dict[str, Any]]:
        async with self.session.get(f"{self.url}/v2/requests", headers=self.auth()) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        return {r["request_id"]: r for r in body["requests"]}

    async def phase_of(self, request_id: str) -> str | None:
        entry = (await self.in_flight()).get(request_id)
        return entry["phase"] if entry else None


StartGateway = Callable[..., Any]


@asynccontextmanager
async def running_gateway(
    *, sim: SimConfig | None = None, token: str | None = None,
    api_process: ApiProcess | None = None, engines: list[Engine] | None = None, **overrides: Any,
) -> AsyncIterator[Gateway]:  # fmt: skip
    config = GatewayConfig(
        http_port=0, grpc_port=0, engine_settings=sim, cancel_token=token, **overrides
    )
    server = GatewayServer(
        config, engines=engines, registry=CollectorRegistry(), api_process=api_process
    )
    listeners = await server.start()
    async with aiohttp.ClientSession() as session:
        try:
            yield Gateway(server, f"http://{listeners['http']}", session, token)
        finally:
            await server.shutdown()


@asynccontextmanager
async def running_api_processes(
    run_dir: Path, count: int, *, sim: SimConfig | None = None
) -> AsyncIterator[list[Gateway]]:
    """``count`` API processes of one gateway, in this process, each on a port of its own (so a
    test picks which one a request or a cancel lands on); they talk over their sockets in
    ``run_dir`` as separate processes do."""
    async with contextlib.AsyncExitStack() as stack:
        gateways = []
        for slot in range(count):
            me = ApiProcess(slot, count, run_dir, restarted=False)
            gateways.append(await stack.enter_async_context(running_gateway(
                sim=sim, api_process=me, workers=count, api_processes=count)))  # fmt: skip
        yield gateways


class _NoTools:
    def plan(self, body: dict[str, Any]) -> None:
        return None


def unstarted_service() -> GenerationService:
    """The service over a simulated engine that is never started: what the request readers of
    every API use (its tokenizer, its features), with no I/O (the parsers' hostile tests)."""
    metrics = GatewayMetrics(CollectorRegistry(), [MODEL])
    pool = EnginePool([SimulatedEngine(SimConfig())])
    return GenerationService(
        pool, CallRegistry(metrics), metrics, ModelInfo(MODEL, 4096), tools=_NoTools()
    )
