"""``Config → Server``: starts the listeners, writes the ready file, and drains on shutdown.

The server runs a list of listeners sharing one ``ServerState`` (calls in flight, the draining
flag, metrics, and the one canceller, with a cancel adapter per protocol). HTTP, gRPC and admin
are built in; other listeners plug in by passing another factory (its key in the ready file is
its ``name``).

Shutdown, in order (SIGTERM or SIGINT):
 1. ``draining`` is set: ``/readyz`` answers 503, new calls on open connections get 503.
 2. Every call listener stops accepting connections.
 3. Calls in flight may finish until ``--drain-timeout`` (a second signal ends the wait).
 4. The rest are stopped with reason ``shutdown``: each is cancelled upstream explicitly.
 5. Cancel calls in flight get until ``--cancel-deadline`` to be answered.
 6. Listeners close (admin last), then the cancel adapters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from hangup_contract.cancel_labels import Reason
from hangup_contract.runtime.files import write_ready_file
from hangup_contract.runtime.watchdog import LoopWatchdog
from proxy.admin import AdminListener
from proxy.calls.siblings import Siblings
from proxy.calls.state import ServerState
from proxy.cancel.canceller import Canceller
from proxy.cancel.choice import open_grpc_adapter, open_http_adapter
from proxy.config import Config
from proxy.grpc.relay import GrpcRelay
from proxy.http.listener import HttpListener
from proxy.labels import CallProtocol
from proxy.metrics import FLUSH_EVERY_S, ProxyMetrics

log = logging.getLogger("hangup.proxy.server")

_STOP_GRACE = 5.0  # seconds for stopped calls to unwind after their handlers are cancelled


class Listener(Protocol):
    """One listening socket and what serves it."""

    @property
    def name(self) -> str:
        """Its key in the ready file (``http``, ``grpc``, ``admin``)."""
        ...

    async def start(self) -> str:
        """Start serving; returns the bound ``host:port``."""
        ...

    async def stop_accepting(self) -> None: ...

    async def close(self) -> None: ...


ListenerFactory = Callable[[ServerState], Listener]
DEFAULT_LISTENERS: tuple[ListenerFactory, ...] = (HttpListener, GrpcRelay, AdminListener)
WORKER_LISTENERS: tuple[ListenerFactory, ...] = (HttpListener, GrpcRelay)  # see proxy.workers
READY_KEYS = ("http", "grpc", "admin")


def listener_factories(config: Config) -> tuple[ListenerFactory, ...]:
    """The listeners this configuration serves, in start order (admin last, closed last); a
    worker of ``--workers`` leaves the admin listener to its supervisor."""
    return WORKER_LISTENERS if config.reuse_port else DEFAULT_LISTENERS


@dataclass(frozen=True)
class WorkerOf:
    """This process is worker ``slot`` of ``count`` (``proxy.workers``), its supervisor's
    private directory ``directory``: where the workers find one another
    (``proxy.calls.siblings``)."""

    directory: Path
    slot: int
    count: int


class Server:
    def __init__(
        self,
        config: Config,
        listeners: Sequence[ListenerFactory] | None = None,
        worker_of: WorkerOf | None = None,
    ) -> None:
        self.config = config
        self._worker_of = worker_of
        self._factories = listener_factories(config) if listeners is None else listeners
        self.registry = CollectorRegistry()
        self.metrics = ProxyMetrics(self.registry)
        self._listeners: list[Listener] = []
        self.state: ServerState | None = None
        self.addresses: dict[str, str | None] = {}
        self._hurry = asyncio.Event()
        self._flushing: asyncio.Task[None] | None = None
        self._watchdog = LoopWatchdog(
            0.0,
            log_after=config.loop_stall_log,
            on_stall=self.metrics.event_loop_stalls.inc,
            log=log,
        )

    async def start(self) -> dict[str, str | None]:
        """Start every listener (inside the running loop); returns the ready-file map."""
        config = self.config
        canceller = Canceller(
            {
                CallProtocol.HTTP: open_http_adapter(
                    config, self.metrics.cancel_pool_members.observe
                ),
                CallProtocol.GRPC: open_grpc_adapter(config),
            },
            self.metrics,
            deadline=config.cancel_deadline,
            backoff=config.cancel_backoff,
            backoff_max=config.cancel_backoff_max,
            concurrency=config.cancel_concurrency,
        )
        self.state = ServerState(config, self.metrics, canceller)
        held, worker = self.state.held, self._worker_of
        if held is not None and worker is not None and worker.count > 1:
            siblings = Siblings(
                worker.directory, worker.slot, worker.count, held,
                wait=config.cancel_attempt_timeout,
            )  # fmt: skip
            await siblings.start()
            held.on_spent = lambda request_id: siblings.tell("unbury", request_id)
            siblings.listing = self.state.listing
            self.state.siblings = siblings
        if held is not None:
            held.on_expired = lambda held: self.metrics.held(held.sizes())
            self.metrics.held(held.sizes())
            held.start()
        self._watchdog.start()
        self._flushing = asyncio.get_running_loop().create_task(self._flush_metrics())
        self.addresses = dict.fromkeys(READY_KEYS)
        for factory in self._factories:
            listener = factory(self.state)
            self._listeners.append(listener)
            self.addresses[listener.name] = await listener.start()
        if config.ready_file is not None:
            write_ready_file(config.ready_file, self.addresses)
        log.info(
            "serving",
            extra={"fields": {"listeners": self.addresses, "upstream": config.upstream_http}},
        )
        return self.addresses

    async def shutdown(self) -> None:
        """Drain and stop (the sequence in the module docstring). Idempotent."""
        state = self.state
        if state is None or state.draining:
            return
        state.draining = True
        log.info("draining", extra={"fields": {"inflight": state.inflight}})
        for listener in self._listeners:
            await listener.stop_accepting()
        if not await self._drained(state):
            stopped = state.stop_all(Reason.SHUTDOWN)
            log.warning(
                "drain timeout: cancelling the rest", extra={"fields": {"stopped": stopped}}
            )
            await state.wait_idle(_STOP_GRACE)
        await state.canceller.drain(self.config.cancel_deadline)
        for listener in self._listeners:
            await listener.close()
        await state.canceller.close()
        if state.siblings is not None:
            await state.siblings.close()
        if state.held is not None:
            state.held.stop()
        await self._watchdog.stop()
        if self._flushing is not None:
            self._flushing.cancel()
        self.metrics.flush()  # a worker's files hold every call before it exits
        log.info("stopped")

    async def _flush_metrics(self) -> None:
        """The per-call metric updates written every ``FLUSH_EVERY_S`` (``proxy.metrics``): a
        ``--workers`` worker's metrics files are read without it collecting."""
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            self.metrics.flush()

    def hurry(self) -> None:
        """End the drain now: calls still in flight are cancelled with reason ``shutdown``."""
        self._hurry.set()

    async def _drained(self, state: ServerState) -> bool:
        """Wait for the calls in flight, until --drain-timeout or ``hurry()``; True if none left."""
        idle = asyncio.ensure_future(state.wait_idle(self.config.drain_timeout))
        hurried = asyncio.ensure_future(self._hurry.wait())
        await asyncio.wait({idle, hurried}, return_when=asyncio.FIRST_COMPLETED)
        for task in (idle, hurried):
            task.cancel()
        await asyncio.gather(idle, hurried, return_exceptions=True)
        return state.inflight == 0

    async def serve(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, then shut down."""
        try:
            await self.start()
            await stop.wait()
        finally:
            await self.shutdown()
