"""The gateway process: ``GatewayConfig → GatewayServer``, from start to graceful shutdown.

Start: start the engine workers (a worker that fails makes start raise, naming it), build the
registry, service and metrics, with the scope the process count gives (:mod:`.scope`), listen on
HTTP and gRPC, then write the ready file. The process (:func:`serve`) freezes its start-up heap
before it says it is ready, as vLLM's own server does: with vLLM, torch and transformers
imported it holds over half a million objects, and a full collection over them stops every
stream while it runs (how long: docs/benchmarks-log.md, 2026-11-23).

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
import os
import signal
import time
from functools import partial

from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway_server.clients import ClientRule
from gateway_server.config import GatewayConfig
from gateway_server.engine.base import Engine
from gateway_server.engine.pool import EnginePool, RestartPolicy
from gateway_server.engine.table import engine_factory
from gateway_server.engine.tools import ToolSettings
from gateway_server.groups import GroupBounds
from gateway_server.grpc.server import GrpcServerHandle, start_grpc_server
from gateway_server.health import LoopWatchdog, liveness
from gateway_server.http.app import build_app
from gateway_server.metrics.gateway import (
    EngineLoadCollector,
    GatewayMetrics,
    HandoffCollector,
    InflightCollector,
    worker_loads,
)
from gateway_server.metrics.pool import PoolProtocolCollector
from gateway_server.openai.responses.runner import ResponsesRunner
from gateway_server.openai.responses.store import ResponseStore
from gateway_server.registry import CallRegistry, IdBounds
from gateway_server.service import GenerationService, ModelInfo
from gateway_server.siblings import Siblings
from gateway_server.siblings.processes import ApiProcess
from gateway_server.siblings.scope import Scope, SingleProcess
from hangup_contract.cancel_labels import Reason
from hangup_contract.runtime.connections import LimitedAppRunner, LimitedServer, counted_in
from hangup_contract.runtime.files import write_ready_file
from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.shared_listener import BalancedAcceptor
from hangup_contract.runtime.supervision import watch_supervisor

log = logging.getLogger("hangup.gateway")


def restart_policy(config: GatewayConfig) -> RestartPolicy:
    return RestartPolicy(config.engine_restart_backoff, config.engine_restart_backoff_max)


class GatewayServer:
    def __init__(
        self,
        config: GatewayConfig,
        engines: list[Engine] | None = None,
        registry: CollectorRegistry | None = None,
        api_process: ApiProcess | None = None,
    ) -> None:
        self.config = config
        self.metrics_registry = registry or CollectorRegistry()
        share = None if api_process is None else api_process.workers(config.workers)
        factory = None
        if engines is None:  # the gateway's own: restarted when they die
            factory = engine_factory(config.engine, config.engine_context)
            engines = [factory(i) for i in share or range(config.workers)]
        self.metrics = GatewayMetrics(self.metrics_registry, [config.model_name])
        self.pool = EnginePool(
            engines,
            share.start if share else 0,
            factory=factory,
            policy=restart_policy(config),
            on_restart=self.metrics.count_engine_restart,
            roles=config.roles if config.worker_roles else None,
        )
        self.metrics.create_worker_series(w.name for w in self.pool.workers)
        self.watchdog = LoopWatchdog(
            config.loop_stall_limit,
            log_after=config.loop_stall_log,
            on_stall=self.metrics.event_loop_stalls.inc,
            log=log,
        )
        ended, tombstones = self._id_bounds()
        self.registry = CallRegistry(
            self.metrics,
            tombstone_ttl=config.tombstone_ttl,
            ended=ended,
            tombstones=tombstones,
            groups=GroupBounds(config.max_groups, config.max_group_calls),
        )
        self.api_process = api_process
        self.scope = self._scope()
        self.service: GenerationService | None = None
        self.responses: ResponsesRunner | None = None
        self.listeners: dict[str, str | None] = {}
        self._runner: LimitedAppRunner | None = None
        self._acceptor: BalancedAcceptor | None = None  # an API process: the shared socket
        self._grpc: GrpcServerHandle | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()

    def _scope(self) -> Scope:
        """The whole gateway in this process, or this API process as one of several."""
        model = self.config.model_name
        loads = partial(worker_loads, self.pool)
        live = (
            InflightCollector([model], self.registry.phases_in_flight),
            EngineLoadCollector(loads),
            HandoffCollector(lambda: len(self.registry.handoffs())),
        )
        ended, tombstones = self._id_bounds()
        if self.api_process is None:
            pool = PoolProtocolCollector(model, loads)
            return SingleProcess(self.registry, self.metrics_registry, live, pool)
        return Siblings(
            self.api_process,
            self.registry,
            self.metrics,
            live,
            loads,
            tombstone_ttl=self.config.tombstone_ttl,
            ended=ended,
            tombstones=tombstones,
            model=model,
        )

    def _id_bounds(self) -> tuple[IdBounds, IdBounds]:
        """What the memories of ended ids and of tombstones each hold (the registry's, and with
        API processes the homes')."""
        cfg = self.config
        ended = IdBounds(cfg.ended_ids_max, cfg.ended_ids_max_bytes)
        return ended, IdBounds(cfg.tombstones_max, cfg.tombstones_max_bytes)

    async def start(self, *, freeze_heap: bool = False) -> dict[str, str | None]:
        """Start engines and listeners; returns ``{"http": "host:port", "grpc": ...}``.

        ``freeze_heap``: this server owns its process; freeze the start-up heap (see
        :func:`freeze_startup_heap`) before writing the ready file.
        """
        cfg = self.config
        await self.pool.start()
        model = ModelInfo(cfg.model_name, self.pool.workers[0].engine.max_model_len)
        engine = self.pool.workers[0].engine
        tools = ToolSettings(cfg.tool_call_parser, cfg.enable_auto_tool_choice)
        self.service = GenerationService(
            self.pool,
            self.registry,
            self.metrics,
            model,
            self.scope.directory,
            tools=engine.tool_calling(tools, cfg.model or model.name),
            liveness=liveness(self.pool.down_for, cfg.engine_down_limit, self.watchdog),
            clients=ClientRule(cfg.client_header.lower() if cfg.client_header else None),
        )
        store = ResponseStore(
            cfg.responses_max_stored,
            cfg.responses_ttl,
            background_per_client=cfg.responses_background_per_client,
            stored_per_client=cfg.responses_stored_per_client,
        )
        self.responses = ResponsesRunner(self.service, store)
        self.responses.homes = self.scope.response_homes(self.responses)
        self.watchdog.start()
        await self.scope.start()
        http = await self._start_http(self.service, self.responses)
        self._grpc = await start_grpc_server(self.service, cfg)
        self.listeners = {"http": http, "grpc": f"{cfg.host}:{self._grpc.port}"}
        if self._grpc.process_port is not None:
            self.listeners["grpc_processes"] = f"{cfg.host}:{self._grpc.process_port}"
        if freeze_heap:
            freeze_startup_heap()
        if cfg.ready_file is not None:
            write_ready_file(cfg.ready_file, self.listeners)
        log_event(
            log,
            "serving",
            **self.listeners,
            model=model.name,
            engine=cfg.engine,
            workers=cfg.workers,
        )
        return self.listeners

    async def _start_http(self, service: GenerationService, responses: ResponsesRunner) -> str:
        """Listen on HTTP (with siblings, on the port they share); returns ``host:port``."""
        cfg = self.config
        app = build_app(
            service,
            self.scope.exposition,
            pool_metrics=self.scope.pool_exposition,
            cancel_token=cfg.cancel_token,
            sim_faults=cfg.sim_faults,
            max_body_bytes=cfg.max_body_bytes,
            body_timeout=cfg.body_timeout,
            responses=responses,
            max_batch_ids=cfg.max_batch_ids,
        )
        self._runner = LimitedAppRunner(
            app,
            limits=cfg.connection_limits,
            listener="http",
            on_close=counted_in(self.metrics.connections_closed, "http"),
            server_header="hangup-gateway",
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
            max_line_size=cfg.max_header_bytes,
            max_field_size=cfg.max_header_bytes,
        )
        await self._runner.setup()
        server = self._runner.server
        assert isinstance(server, LimitedServer)
        if self.api_process is not None:  # siblings share the supervisor's listening socket
            self._acceptor = BalancedAcceptor.from_environ(os.environ, server, lambda: server.open)
        if self._acceptor is not None:
            server.on_open_changed = self._acceptor.changed
            self._acceptor.start()
            return self._acceptor.address
        site = web.TCPSite(self._runner, cfg.host, cfg.http_port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"{host}:{port}"

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
        assert self.responses is not None
        self.service.draining = True
        for site in list(self._runner.sites):
            await site.stop()
        if self._acceptor is not None:
            self._acceptor.stop()
        if self._grpc is not None:
            await self._grpc.stop_accepting()
        remaining = len(self.registry)
        if remaining:
            log_event(log, "draining", calls=remaining, timeout_s=self.config.drain_timeout)
            waiters = [
                asyncio.ensure_future(self.registry.wait_idle()),
                asyncio.ensure_future(self._force.wait()),
            ]
            await asyncio.wait(
                waiters, timeout=self.config.drain_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in waiters:
                waiter.cancel()
        cancelled = await self.registry.cancel_all(Reason.SHUTDOWN)
        if cancelled:
            log_event(log, "drain_timeout", cancelled_calls=cancelled)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.responses.stop()  # background responses still running end cancelled
        await self._runner.cleanup()
        await self.pool.shutdown()
        await self.watchdog.stop()
        await self.scope.close()
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
    log_event(
        log,
        "startup_heap_frozen",
        objects=gc.get_freeze_count(),
        ms=round((time.perf_counter() - started) * 1e3, 1),
    )


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
