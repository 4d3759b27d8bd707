"""The admin listener: ``/metrics`` (Prometheus text), ``/healthz`` (alive) and ``/readyz``.

``/readyz`` answers 503 from the moment shutdown starts, so a load balancer or Kubernetes stops
sending new calls while the ones in flight drain. The admin listener keeps serving through the
drain and closes last.
"""

from __future__ import annotations

import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hangup_contract.runtime.connections import LimitedAppRunner, counted_in
from proxy.headers import SERVER_HEADER
from proxy.state import ServerState


class AdminListener:
    name = "admin"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._runner: LimitedAppRunner | None = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._state.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self._state.draining:
            return web.Response(status=503, text="draining\n")
        return web.Response(text="ready\n")

    async def start(self) -> str:
        config = self._state.config
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = LimitedAppRunner(
            app, limits=config.connection_limits, listener=self.name,
            on_close=counted_in(self._state.metrics.connections_closed, self.name),
            server_header=SERVER_HEADER, access_log=None,
        )  # fmt: skip
        await self._runner.setup()
        sock = socket.create_server((config.host, config.admin_port))
        await web.SockSite(self._runner, sock).start()
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"

    async def stop_accepting(self) -> None:
        return None  # stays up through the drain: /readyz must be seen to turn 503

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
