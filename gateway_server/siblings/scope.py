"""How far this process reaches: the whole gateway, or one API process of several.

The gateway picks one :class:`Scope` when it is built, and everything that depends on the
process count goes through it:

- the service's :class:`CallDirectory`: where a call's id is claimed and released, how a
  cancel finds it, what ``GET /v2/requests`` lists;
- where a response id made by another API process is cancelled (:class:`ResponseHomes`);
- ``/metrics`` and ``/metrics/pool``.

:class:`SingleProcess` is the whole gateway in this process: the registry's own checks are the
gateway's, its metrics registry is the exposition. With ``--api-processes`` it is
:class:`gateway_server.siblings.Siblings`, over the sibling channel.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gateway_server.registry import CallRegistry
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import CancelAnswer
from hangup_contract.vocabulary import Reason


class CallDirectory(Protocol):
    """Request ids gateway-wide, as the service sees them."""

    def fresh_id(self) -> str:
        """A fresh id for a call that came without one (no other caller knows it: it can be
        neither a duplicate nor cancelled before it arrives)."""
        ...

    async def claim(self, request_id: str) -> None:
        """Claim ``request_id`` (already open in this process's registry) gateway-wide.

        Raises DuplicateRequestId (in flight elsewhere) or CancelledBeforeArrival (a cancel
        came first); the caller undoes its local open."""
        ...

    def release(self, request_id: str, tokens: int) -> None:
        """``request_id`` ended here after ``tokens`` tokens. Never raises, never waits."""
        ...

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The cancel contract (``CallRegistry.cancel``'s answers), wherever the id runs."""
        ...

    async def all_calls(self) -> list[dict[str, object]]:
        """Every call in flight in the gateway (``GET /v2/requests``)."""
        ...


class ResponseHomes(Protocol):
    """The other API processes, as the homes of the response ids each made."""

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Cancel the response at its home; its object once it ended. Raises RequestNotFound
        when the home holds none under that id (or is this process, or does not answer)."""
        ...


CancelHere = Callable[[str], Awaitable[dict[str, Any]]]
"""Cancel a response held in this process, by id (RequestNotFound when none is)."""


class Scope(Protocol):
    @property
    def directory(self) -> CallDirectory:
        """The service's call directory."""
        ...

    def response_homes(self, cancel_here: CancelHere) -> ResponseHomes | None:
        """Where response ids made elsewhere are cancelled, answering the siblings' own with
        ``cancel_here``; None when this process is the gateway. Before :meth:`start`."""
        ...

    async def start(self) -> None:
        """Before the listeners open."""
        ...

    async def close(self) -> None:
        """After the listeners closed and the engines stopped."""
        ...

    async def exposition(self) -> bytes:
        """``/metrics``."""
        ...

    async def pool_exposition(self) -> bytes:
        """``/metrics/pool`` (the Endpoint Picker's gauges)."""
        ...


class LocalDirectory:
    """The gateway is this process: the registry's open already refused duplicates and spent
    tombstones, and its cancel and listing are the gateway's."""

    def __init__(self, registry: CallRegistry) -> None:
        self._registry = registry

    def fresh_id(self) -> str:
        return request_ids.new_request_id()

    async def claim(self, request_id: str) -> None:
        return None

    def release(self, request_id: str, tokens: int) -> None:
        return None

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        return await self._registry.cancel(request_id, reason)

    async def all_calls(self) -> list[dict[str, object]]:
        return self._registry.describe()


class SingleProcess:
    """One API process: the whole gateway. ``live`` (the in-flight and engine-load gauges) and
    ``pool`` (the Endpoint Picker's) are read at each scrape of ``metrics``."""

    def __init__(
        self,
        registry: CallRegistry,
        metrics: CollectorRegistry,
        live: Iterable[Collector],
        pool: Collector,
    ) -> None:
        self.directory = LocalDirectory(registry)
        for collector in (*live, pool):
            metrics.register(collector)
        self._metrics = metrics
        self._pool = CollectorRegistry(auto_describe=False)
        self._pool.register(pool)

    def response_homes(self, cancel_here: CancelHere) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def exposition(self) -> bytes:
        return generate_latest(self._metrics)

    async def pool_exposition(self) -> bytes:
        return generate_latest(self._pool)
