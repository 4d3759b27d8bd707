"""The HTTP/1.1 listening socket and the proxy's own server on it (``proxy.http.server``:
connections held to the configured limits, each a ``proxy.http.protocol`` glue over its
``proxy.http.core``); each call is relayed by :class:`proxy.http.HttpRelay`,
told the moment its client's connection is lost. A worker (``--workers N``) accepts from the
socket its supervisor shares with every worker, while it is the least loaded
(:mod:`hangup_contract.runtime.shared_listener`)."""

from __future__ import annotations

import asyncio
import os
import socket

from hangup_contract.runtime.connections import counted_in
from hangup_contract.runtime.shared_listener import BalancedAcceptor
from proxy.calls.state import ServerState
from proxy.http.relay import HttpRelay
from proxy.http.server import HttpServer
from proxy.messages import error_answer

_CLOSE_TIMEOUT = 5.0  # seconds for handlers still running at close (the drain came first)


class HttpListener:
    """The HTTP/1.1 listening socket and its server."""

    name = "http"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._relay = HttpRelay(state)
        self._server: HttpServer | None = None
        self._listening: asyncio.Server | None = None
        self._acceptor: BalancedAcceptor | None = None

    async def start(self) -> str:
        config = self._state.config
        server = self._server = HttpServer(
            self._relay,
            on_lost=self._relay.connection_lost,
            error=error_answer,
            limits=config.connection_limits,
            on_close=counted_in(self._state.metrics.connections_closed, self.name),
            listener=self.name,
            max_header_size=config.max_header_size,
            max_headers=config.max_headers,
        )
        self._acceptor = BalancedAcceptor.from_environ(os.environ, server, lambda: server.open)
        if self._acceptor is not None:
            server.on_open_changed = self._acceptor.changed
            self._acceptor.start()
            return self._acceptor.address
        sock = socket.create_server((config.host, config.http_port), backlog=1024)
        self._listening = await asyncio.get_running_loop().create_server(server, sock=sock)
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"

    async def stop_accepting(self) -> None:
        if self._acceptor is not None:
            self._acceptor.stop()
        if self._listening is not None:
            self._listening.close()
            self._listening = None

    async def close(self) -> None:
        if self._server is not None:
            await self._server.shutdown(_CLOSE_TIMEOUT)
        await self._relay.close()
