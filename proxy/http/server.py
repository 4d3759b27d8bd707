"""The proxy's HTTP/1.1 server: every client connection of one listener (each an
``proxy.http.protocol.HttpConnection`` over its ``proxy.http.core.HttpCore``), held to the
configured limits.

The limits (``hangup_contract.runtime.connections``, the same as every listener's): the header
and idle clocks run while no request is handled (each connection's core says when one ran
out), enforced by a sweep; connections past
``max_connections`` are closed as they open. Every close for a limit is counted by reason.
Shutdown closes idle connections at once and the rest once their request is answered, within a
grace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from hangup_contract.runtime.connections import (
    SWEEP_S,
    CloseReason,
    ClosesNoted,
    ConnectionLimits,
    OnClose,
)
from proxy.http.protocol import Handler, HttpConnection
from proxy.messages import Answer


class HttpServer:
    """Every client connection of one listener, held to ``limits`` (the module docstring);
    called, it makes the protocol for a new connection."""

    def __init__(
        self,
        handler: Handler,
        *,
        on_lost: Callable[[HttpConnection], None],
        error: Callable[[int, str], Answer],
        limits: ConnectionLimits,
        on_close: OnClose,
        listener: str,
        max_header_size: int,
        max_headers: int,
    ) -> None:
        self.handler = handler
        self.on_lost = on_lost  # a connection with a request under way is lost
        self.error = error  # the answer to a request refused for ``message``
        self.limits = limits
        self.max_header_size = max_header_size
        self.max_headers = max_headers
        self.loop = asyncio.get_running_loop()
        self.connections: set[HttpConnection] = set()
        self.closing = False
        self.open = 0
        self.on_open_changed: Callable[[], None] = lambda: None  # a shared listener's board
        self.note = ClosesNoted(on_close, listener)  # count a close, log the first of a reason
        shortest = min(t for t in (limits.header_timeout, limits.idle_timeout, SWEEP_S * 4) if t)
        self._sweep_every = shortest / 4
        self._sweeping: asyncio.TimerHandle | None = None
        self._settled: asyncio.Event | None = None

    def __call__(self) -> HttpConnection:
        if self._sweeping is None and not self.closing:
            self._sweeping = self.loop.call_later(self._sweep_every, self._sweep)
        return HttpConnection(self)

    def refusal(self, status: int, message: str) -> bytes:
        """The whole answer to a request refused for ``message``; the connection closes after
        it."""
        answer = self.error(status, message)
        answer.force_close()
        return answer.encode("GET", (1, 1), False)[0]

    def opened(self, connection: HttpConnection) -> None:
        self.connections.add(connection)
        self.open += 1
        self.on_open_changed()
        cap = self.limits.max_connections
        if self.closing:
            connection.close()
        elif cap and len(self.connections) > cap:
            self._close(connection, CloseReason.TOO_MANY_CONNECTIONS)

    def lost(self, connection: HttpConnection) -> None:
        self.connections.discard(connection)
        self.open -= 1
        self.on_open_changed()
        self._settle()

    def _settle(self) -> None:
        """While shutting down: wake the shutdown once no connection has a request under way
        (each closes once its request is answered)."""
        if self._settled is not None and not any(c.busy() for c in self.connections):
            self._settled.set()

    async def shutdown(self, grace: float) -> None:
        """Close idle connections now, the rest once their request is answered, at most
        ``grace`` seconds from now (then their handlers are cancelled)."""
        self.closing = True
        if self._sweeping is not None:
            self._sweeping.cancel()
        for connection in list(self.connections):
            if not connection.busy():
                connection.close()
        self._settled = asyncio.Event()
        self._settle()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._settled.wait()
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)  # the connections' losses are handled

    def _sweep(self) -> None:
        now = self.loop.time()
        header, idle = self.limits.header_timeout, self.limits.idle_timeout
        for connection in list(self.connections):
            reason = connection.core.expired(now, header, idle)
            if reason is not None:
                self._close(connection, reason)
        self._sweeping = self.loop.call_later(self._sweep_every, self._sweep)

    def _close(self, connection: HttpConnection, reason: CloseReason) -> None:
        connection.close()
        self.note(reason)
