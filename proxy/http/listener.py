"""The HTTP/1.1 listening socket and its aiohttp server (connections held to the configured
limits); each call is relayed by :class:`proxy.http.HttpRelay`, told the moment its client's
connection is lost. A worker (``--workers N``) accepts from the socket its supervisor shares
with every worker, while it is the least loaded (:mod:`hangup_contract.runtime.shared_listener`)."""

from __future__ import annotations

import os
import socket
from typing import Any

from aiohttp import web

from hangup_contract.runtime.connections import LimitedServer, counted_in
from hangup_contract.runtime.shared_listener import BalancedAcceptor
from proxy.http.logs import server_logger
from proxy.http.relay import HttpRelay
from proxy.state import ServerState
from proxy.vocabulary import SERVER_HEADER

_CLOSE_TIMEOUT = 5.0  # seconds for handlers still running at close (the drain came first)


class _Server(LimitedServer):
    """aiohttp's low-level server (connections held to the configured limits), telling the relay
    the moment a client connection is lost."""

    def __init__(self, relay: HttpRelay, **kwargs: Any) -> None:
        super().__init__(relay, **kwargs)
        self._relay = relay

    def connection_lost(
        self, handler: web.RequestHandler, exc: BaseException | None = None
    ) -> None:
        self._relay.connection_lost(handler)
        super().connection_lost(handler, exc)


class HttpListener:
    """The HTTP/1.1 listening socket and its aiohttp server."""

    name = "http"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._relay = HttpRelay(state)
        self._runner: web.ServerRunner | None = None
        self._site: web.SockSite | None = None
        self._acceptor: BalancedAcceptor | None = None

    async def start(self) -> str:
        config = self._state.config
        server = _Server(
            self._relay,
            limits=config.connection_limits,
            on_close=counted_in(self._state.metrics.connections_closed, self.name),
            listener=self.name,
            server_header=SERVER_HEADER,
            handler_cancellation=True,
            access_log=None,
            logger=server_logger(),
            max_line_size=config.max_header_size,
            max_field_size=config.max_header_size,
            max_headers=config.max_headers,
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=_CLOSE_TIMEOUT)
        await self._runner.setup()
        self._acceptor = BalancedAcceptor.from_environ(os.environ, server, lambda: server.open)
        if self._acceptor is not None:
            server.on_open_changed = self._acceptor.changed
            self._acceptor.start()
            return self._acceptor.address
        sock = socket.create_server((config.host, config.http_port), backlog=1024)
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"

    async def stop_accepting(self) -> None:
        if self._acceptor is not None:
            self._acceptor.stop()
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._relay.close()
