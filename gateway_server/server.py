"""The gateway process: ``GatewayConfig → GatewayServer``, from start to graceful shutdown.

Start: start the engine workers (a worker that fails makes start raise, naming it), build the
registry, service and metrics, listen on HTTP (and gRPC when that layer is present), then write
the ready file. The process (:func:`serve`) freezes its start-up heap before it says it is ready,
as vLLM's own server does: with vLLM, torch and transformers imported it holds over half a million
objects, and a full collection over them stopped every stream for about 0.36 s on a 2-core
machine.

Shutdown (first SIGTERM/SIGINT), in this order:
  1. draining: ``/v2/health/ready`` answers 503, new generation requests get 503;
  2. stop accepting connections;
  3. let calls in flight finish, up to ``drain_timeout``;
  4. cancel what is left with reason ``shutdown`` (the engine aborts; streams end with an error);
  5. close the listeners' remaining connections, then stop the engine workers.
A second signal skips the wait in step 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from importlib import import_module
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gateway_server.config import GatewayConfig
from gateway_server.engine.base import Engine
from gateway_server.engine.pool import EnginePool
from gateway_server.engine.sim import SimulatedEngine
from gateway_server.http.app import build_app
from gateway_server.metrics import EngineLoadCollector, GatewayMetrics, InflightCollector
from gateway_server.pool_metrics import PoolProtocolCollector
from gateway_server.processes import ApiProcess
from gateway_server.registry import CallRegistry
from gateway_server.service import GenerationService, ModelInfo
from gateway_server.siblings import Siblings
from gateway_server.tool_calls import ToolCalling, ToolSettings
from hangup_contract.runtime.connections import LimitedAppRunner, counted_in
from hangup_contract.runtime.files import write_ready_file
from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.supervision import watch_supervisor
from hangup_contract.vocabulary import Reason

log = logging.getLogger("hangup.gateway")


def build_engines(config: GatewayConfig, indices: range | None = None) -> list[Engine]:
    """The engine workers (only those of ``indices``, an API process's share, when given)."""
    if config.engine == "sim":
        return [SimulatedEngine(config.sim) for _ in indices or range(config.workers)]
    # Imported only when asked for: importing vLLM takes seconds and a lot of memory.
    vllm_engine: Any = import_module("gateway_server.engine.vllm")
    engines: list[Engine] = vllm_engine.build_vllm_engines(
        config.model, config.vllm, config.workers, indices
    )
    return engines


class GatewayServer:
    def __init__(
        self, config: GatewayConfig, engines: list[Engine] | None = None,
        registry: CollectorRegistry | None = None, api_process: ApiProcess | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.metrics_registry = registry or CollectorRegistry()
        share = None if api_process is None else api_process.workers(config.workers)
        if engines is None:
            engines = build_engines(config, share)
        self.pool = EnginePool(engines, share.start if share else 0)
        self.metrics = GatewayMetrics(self.metrics_registry, [config.model_name])
        self.registry = CallRegistry(self.metrics, tombstone_ttl=config.tombstone_ttl)
        self.api_process = api_process
        self.siblings: Siblings | None = None
        self.service: GenerationService | None = None
        self.listeners: dict[str, str | None] = {}
        self._runner: LimitedAppRunner | None = None
        self._grpc: Any = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()

    async def start(self, *, freeze_heap: bool = False) -> dict[str, str | None]:
        """Start engines and listeners; returns ``{"http": "host:port", "grpc": ...}``.

        ``freeze_heap``: this server owns its process; freeze the start-up heap (see
        :func:`freeze_startup_heap`) before writing the ready file.
        """
        cfg = self.config
        await self.pool.start()
        model = ModelInfo(cfg.model_name, self.pool.workers[0].engine.max_model_len)
        service = GenerationService(self.pool, self.registry, self.metrics, model)
        tools = ToolSettings(cfg.tool_call_parser, cfg.enable_auto_tool_choice)
        engine = self.pool.workers[0].engine
        service.tools = ToolCalling(tools, engine.tool_tokenizer(), cfg.model or model.name)
        self.service = service
        live = (InflightCollector([model.name], service.phases_in_flight),
                EngineLoadCollector(service.worker_loads))  # fmt: skip
        if self.api_process is None:
            pool = PoolProtocolCollector(model.name, service.worker_loads)
            for collector in (*live, pool):
                self.metrics_registry.register(collector)
            exposition = registry_exposition(self.metrics_registry)
            pool_registry = CollectorRegistry(auto_describe=False)
            pool_registry.register(pool)
            pool_exposition = registry_exposition(pool_registry)
        else:
            self.siblings = Siblings(self.api_process, self.registry, self.metrics, live,
                                     tombstone_ttl=cfg.tombstone_ttl, model=model.name)  # fmt: skip
            self.siblings.describe_calls = service.describe_calls
            self.siblings.worker_loads = service.worker_loads
            service.siblings = self.siblings
            await self.siblings.start()
            exposition = self.siblings.exposition
            pool_exposition = self.siblings.pool_exposition
        app = build_app(service, exposition, pool_metrics=pool_exposition,
                        cancel_token=cfg.cancel_token,
                        max_body_bytes=cfg.max_body_bytes,
                        body_timeout=cfg.body_timeout)  # fmt: skip
        self._runner = LimitedAppRunner(
            app, limits=cfg.connection_limits, listener="http",
            on_close=counted_in(self.metrics.connections_closed, "http"),
            server_header="hangup-gateway", handler_cancellation=True, access_log=None,
            shutdown_timeout=5.0,
            max_line_size=cfg.max_header_bytes, max_field_size=cfg.max_header_bytes,
        )  # fmt: skip
        await self._runner.setup()
        shared = self.api_process is not None  # siblings listen on the same port
        site = web.TCPSite(self._runner, cfg.host, cfg.http_port, reuse_port=shared or None)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.listeners = {"http": f"{host}:{port}", "grpc": await self._start_grpc(service)}
        if freeze_heap:
            freeze_startup_heap()
        if cfg.ready_file is not None:
            write_ready_file(cfg.ready_file, self.listeners)
        log_event(log, "serving", **self.listeners, model=model.name, engine=cfg.engine,
                  workers=cfg.workers)  # fmt: skip
        return self.listeners

    async def _start_grpc(self, service: GenerationService) -> str | None:
        try:
            grpc_layer: Any = import_module("gateway_server.grpc.server")
        except ModuleNotFoundError:
            return None  # gRPC layer not part of this build
        self._grpc = await grpc_layer.start_grpc_server(service, self.config)
        return f"{self.config.host}:{self._grpc.port}"

    def request_stop(self) -> None:
        """First call: drain gracefully. Second call: stop waiting for calls to finish."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    async def serve_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self._stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        assert self.service is not None and self._runner is not None
        self.service.draining = True
        for site in list(self._runner.sites):
            await site.stop()
        if self._grpc is not None:
            await self._grpc.stop_accepting()
        remaining = len(self.registry)
        if remaining:
            log_event(log, "draining", calls=remaining, timeout_s=self.config.drain_timeout)
            waiters = [asyncio.ensure_future(self.registry.wait_idle()),
                       asyncio.ensure_future(self._force.wait())]  # fmt: skip
            await asyncio.wait(waiters, timeout=self.config.drain_timeout,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            for waiter in waiters:
                waiter.cancel()
        cancelled = await self.registry.cancel_all(Reason.SHUTDOWN)
        if cancelled:
            log_event(log, "drain_timeout", cancelled_calls=cancelled)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self._runner.cleanup()
        await self.pool.shutdown()
        if self.siblings is not None:
            await self.siblings.close()
        log_event(log, "stopped")


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now into the permanent generation.

    Full (oldest-generation) collections walk every tracked object while the event loop waits;
    after this they walk only what serving allocates. The modules, engines and tokenizers loaded
    at start-up live as long as the process, so nothing the collector could free is hidden.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log_event(log, "startup_heap_frozen", objects=gc.get_freeze_count(),
              ms=round((time.perf_counter() - started) * 1e3, 1))  # fmt: skip


async def serve(config: GatewayConfig, api_process: ApiProcess | None = None) -> None:
    server = GatewayServer(config, api_process=api_process)
    try:
        await server.start(freeze_heap=True)
    except BaseException:
        with contextlib.suppress(Exception):
            await server.pool.shutdown()
        raise
    watching = None
    if api_process is not None:
        watching = asyncio.create_task(watch_supervisor(server.request_stop))
    try:
        await server.serve_until_stopped()
    finally:
        if watching is not None:
            watching.cancel()


def registry_exposition(registry: CollectorRegistry) -> Callable[[], Awaitable[bytes]]:
    async def exposition() -> bytes:
        return generate_latest(registry)

    return exposition
