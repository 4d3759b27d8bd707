"""The admin listener: ``/metrics`` (Prometheus text), ``/healthz`` (alive) and ``/readyz``.

``/readyz`` answers 503 from the moment shutdown starts, so a load balancer or Kubernetes stops
sending new calls while the ones in flight drain. The admin listener keeps serving through the
drain and closes last. With ``--workers`` the supervisor serves it (``proxy.workers``): the
workers' metrics summed, ready while every worker serves, alive unless no worker has served for
a while (they keep failing to start). A one-process proxy is alive while it answers, and exports
the supervisor's ``hangup_proxy_worker_restarts_total`` too (at 0: alerts and dashboards read it
in every mode).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from hangup_contract.runtime.connections import LimitedAppRunner, counted_in
from proxy.calls.state import ServerState
from proxy.config import Config
from proxy.labels import SERVER_HEADER
from proxy.metrics import worker_restarts


class AdminSite:
    """The admin HTTP server: ``registry`` on /metrics, ``ready()`` on /readyz."""

    def __init__(
        self,
        config: Config,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        closed: Counter,
        live: Callable[[], bool] = lambda: True,
    ) -> None:
        self._config = config
        self._registry = registry
        self._ready = ready
        self._live = live
        self._closed = closed
        self._runner: LimitedAppRunner | None = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        if not self._live():
            return web.Response(status=503, text="no worker serving\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if not self._ready():
            return web.Response(status=503, text="not ready\n")
        return web.Response(text="ready\n")

    async def start(self) -> str:
        config = self._config
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = LimitedAppRunner(
            app,
            limits=config.connection_limits,
            listener="admin",
            on_close=counted_in(self._closed, "admin"),
            server_header=SERVER_HEADER,
            access_log=None,
        )
        await self._runner.setup()
        sock = socket.create_server((config.host, config.admin_port))
        await web.SockSite(self._runner, sock).start()
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class AdminListener:
    """The admin listener of a one-process proxy (a listener of ``proxy.server``)."""

    name = "admin"

    def __init__(self, state: ServerState) -> None:
        self._site = AdminSite(
            state.config,
            state.metrics.registry,
            lambda: not state.draining,
            state.metrics.connections_closed,
        )
        worker_restarts(state.metrics.registry)  # stays 0: a one-process proxy restarts none

    async def start(self) -> str:
        return await self._site.start()

    async def stop_accepting(self) -> None:
        return None  # stays up through the drain: /readyz must be seen to turn 503

    async def close(self) -> None:
        await self._site.close()
