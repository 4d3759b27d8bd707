"""Several API processes, one gateway: how a cancel finds its request (``--api-processes P``).

The package holds the API processes whatever their number: :mod:`.scope` (one process or several:
the call directory and ``/metrics`` a process uses), :mod:`.processes` (the supervisor, which
workers each process runs), and, here and in the other modules, what several of them share.

Each API process serves the shared HTTP and gRPC ports (HTTP connections go to the process
holding fewest, :mod:`hangup_contract.runtime.shared_listener`; the kernel spreads gRPC ones, and
with ``--grpc-process-ports`` each also serves a gRPC port of its own, :mod:`.processes`) and
runs the requests it accepts on its own engine workers; its
:class:`~gateway_server.registry.CallRegistry` holds them. What must hold across processes, the
cancel contract, rests on one rule:

**Every request id has a home process**, ``crc32(id) % P``. The home keeps the id's entry:
which process runs it (live), that it ended (with its tokens), or a tombstone (a cancel that
came first). So:

- *open* (a call, or an aliased request of a gRPC stream): the accepting process registers the
  id locally, then claims it at its home. The home refuses a duplicate in flight anywhere
  (409) or spends a tombstone (the request is refused as cancelled before it arrived, wherever
  it landed). When the call ends, the owner tells the home (one message, no answer awaited).
  An id the gateway makes (a call that came without one) is drawn so that its home is the
  process running it: nobody else knows it, so there is nothing to check elsewhere, and its
  claim and release never leave the process.
- *cancel* accepted by process C: if C runs the id, it cancels it (no hop). Otherwise C asks
  the home (hop 1); the home cancels it if it runs it, else asks the owner (hop 2) and passes
  the owner's answer back (``cancelled`` with phase and tokens). An id that ended answers
  ``finished`` from the home's entries; an unknown id leaves a tombstone at the home, 404.
  A cancel therefore crosses at most two hops; ``hangup_gateway_cancel_forward_seconds``
  measures them.
- *home unreachable* (a process restarting): a claim goes ahead unchecked (logged), a cancel
  asks every sibling instead. A process that starts says hello to its siblings: they forget
  what its previous life owned (those calls died with it) and send it the entries whose home
  it is, so its entries are whole again. Tombstones and ended ids a dead home held are lost.
- ``GET /v2/requests`` and ``/metrics`` ask every sibling and answer for the whole gateway.

The package, one concern a module:

- :mod:`.ops`: what the processes ask one another (``Op``) on the sibling channel,
  :mod:`hangup_contract.runtime.siblings` (JSON lines, one connection per pair, answers matched
  by sequence number, a deadline on every question; the proxy's workers use it too);
- :mod:`.directory`: the homes' entries and the service's call directory over the channel;
- :mod:`.metrics`: ``/metrics`` and ``/metrics/pool`` gathered from every process;
- :mod:`.responses`: a response's cancel, GET, DELETE, resumed stream and turns, asked of the
  process that made its id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.registry import Collector

from gateway_server.metrics.gateway import GatewayMetrics, WorkerLoad
from gateway_server.registry import ID_BOUNDS, CallRegistry, IdBounds
from gateway_server.siblings.directory import SiblingDirectory
from gateway_server.siblings.metrics import SiblingMetrics
from gateway_server.siblings.ops import channel_of
from gateway_server.siblings.processes import ApiProcess
from gateway_server.siblings.responses import SiblingResponses
from gateway_server.siblings.scope import ResponsesHere
from hangup_contract.runtime.siblings import home_of

__all__ = ["SiblingDirectory", "SiblingMetrics", "Siblings", "home_of"]


class Siblings:
    """This API process as one of several (a :class:`~gateway_server.siblings.scope.Scope`): its
    channel, its call directory over it, and the gateway-wide expositions.

    ``live``: the collectors of this process's in-flight and engine-load gauges;
    ``worker_loads``: its engine workers' loads, read at every scrape."""

    def __init__(
        self,
        me: ApiProcess,
        registry: CallRegistry,
        metrics: GatewayMetrics,
        live: Iterable[Collector],
        worker_loads: Callable[[], Iterable[WorkerLoad]],
        *,
        tombstone_ttl: float,
        ended: IdBounds = ID_BOUNDS,
        tombstones: IdBounds = ID_BOUNDS,
        model: str,
    ) -> None:
        """``ended``, ``tombstones``: what the home's memories of ids hold (as the registry's)."""
        self.channel = channel_of(me)
        self.directory = SiblingDirectory(
            self.channel,
            registry,
            metrics,
            tombstone_ttl=tombstone_ttl,
            ended=ended,
            tombstones=tombstones,
        )
        self.metrics = SiblingMetrics(me, self.channel, live, worker_loads, model=model)

    def response_homes(self, here: ResponsesHere) -> SiblingResponses:
        return SiblingResponses(self.channel, here)

    async def start(self) -> None:
        """Listen, then say hello (see :meth:`SiblingDirectory.greet`)."""
        await self.channel.listen()
        await self.directory.greet()

    async def close(self) -> None:
        await self.channel.close()

    async def exposition(self) -> bytes:
        return await self.metrics.exposition()

    async def pool_exposition(self) -> bytes:
        return await self.metrics.pool_exposition()
