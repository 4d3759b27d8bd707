"""The gRPC listener as the proxy server runs it: the relay plus the canceller its calls use.

Shaped like every listener of ``proxy.server`` (``name``, ``start``, ``stop_accepting``,
``close``) and built from the shared ``ServerState``. Its cancel calls go over gRPC
(``hangup.v1.Cancellation`` on ``--upstream-grpc``) through a ``Canceller`` of its own, with the
same deadline, backoff and concurrency settings as the HTTP side's.

Shutdown, as the server drives it: ``draining`` is set (new calls get ``UNAVAILABLE``), calls
finish or are stopped with reason ``shutdown`` (each cancelled upstream); ``close`` then waits
for this listener's cancel calls up to ``--cancel-deadline`` and closes the socket.
"""

from __future__ import annotations

import logging

from proxy.cancel import Canceller
from proxy.grpc import GrpcRelay, GrpcRelayConfig
from proxy.grpc_cancel import open_grpc_adapter
from proxy.grpc_peer import can_tell_disconnects
from proxy.state import ServerState

log = logging.getLogger("hangup.proxy.grpc")


class GrpcListener:
    name = "grpc"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._canceller: Canceller | None = None
        self._relay: GrpcRelay | None = None

    async def start(self) -> str:
        """Bind and serve; returns ``host:port``. Raises OSError when it cannot bind."""
        config = self._state.config
        self._canceller = Canceller(
            open_grpc_adapter(config),
            self._state.metrics,
            deadline=config.cancel_deadline,
            backoff=config.cancel_backoff,
            backoff_max=config.cancel_backoff_max,
            concurrency=config.cancel_concurrency,
        )
        self._relay = GrpcRelay(GrpcRelayConfig.from_config(config), self._state, self._canceller)
        await self._relay.start()
        if not can_tell_disconnects():
            log.warning(
                "sock_diag is unavailable: gRPC clients that vanish count as grpc_cancelled"
            )
        return f"{config.host}:{self._relay.port}"

    async def stop_accepting(self) -> None:
        """New calls are refused through the shared draining flag; nothing else to do here."""

    async def close(self) -> None:
        if self._relay is not None:
            await self._relay.stop(0)
        if self._canceller is not None:
            await self._canceller.drain(self._state.config.cancel_deadline)
            await self._canceller.close()
