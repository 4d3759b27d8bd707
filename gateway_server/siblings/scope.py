"""How far this process reaches: the whole gateway, or one API process of several.

The gateway picks one :class:`Scope` when it is built, and everything that depends on the
process count goes through it:

- the service's :class:`CallDirectory`: where a call's id is claimed and released, how a
  cancel finds it, what ``GET /v2/requests`` lists;
- where a response id made by another API process is found (:class:`ResponseHomes`): its
  cancel, ``GET`` (and a resumed stream), ``DELETE`` and a ``previous_response_id`` naming it;
- ``/metrics`` and ``/metrics/pool``.

:class:`SingleProcess` is the whole gateway in this process: the registry's own checks are the
gateway's, its metrics registry is the exposition. With ``--api-processes`` it is
:class:`gateway_server.siblings.Siblings`, over the sibling channel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gateway_server.registry import CallRegistry
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import Reason


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

    async def cancel_group(self, group: str, reason: Reason) -> list[dict[str, object]]:
        """Cancel every call of ``group``, in every process (``CallRegistry.cancel_group``):
        each call's answer, as JSON."""
        ...

    async def all_calls(self) -> list[dict[str, object]]:
        """Every call in flight in the gateway (``GET /v2/requests``)."""
        ...


@dataclass(frozen=True, slots=True)
class Page:
    """A background response's events as one process reads them for another: the SSE bytes
    of those after the asked number, the last one's number, and whether it was the last."""

    events: bytes
    last: int
    ended: bool


class ResponsesHere(Protocol):
    """What this process answers of the responses it holds, by id, when a sibling asks.
    Each raises RequestNotFound (none held here), or InvalidRequest as its route would."""

    async def cancel_here(self, response_id: str) -> dict[str, Any]:
        """Cancel it; its object once it ended."""
        ...

    def retrieve_here(self, response_id: str) -> dict[str, Any]:
        """A stored response's object (``GET``)."""
        ...

    def delete_here(self, response_id: str) -> dict[str, Any]:
        """Forget a stored response that ended (``DELETE``)."""
        ...

    def turns_here(self, response_id: str) -> list[dict[str, Any]]:
        """The turns a ``previous_response_id`` naming it continues."""
        ...

    async def page_here(self, response_id: str, after: int) -> Page:
        """A background response's events after ``after``: those ready, else the next ones
        within a wait (``GET ...?stream=true``)."""
        ...


class ResponseHomes(Protocol):
    """The other API processes, as the homes of the response ids each made: each method asks
    the id's home its :class:`ResponsesHere` counterpart. Each raises what the home raised;
    RequestNotFound when the home is this process, or does not answer."""

    async def cancel(self, response_id: str) -> dict[str, Any]: ...

    async def retrieve(self, response_id: str) -> dict[str, Any]: ...

    async def delete(self, response_id: str) -> dict[str, Any]: ...

    async def turns(self, response_id: str) -> list[dict[str, Any]]: ...

    async def page(self, response_id: str, after: int) -> Page: ...


class Scope(Protocol):
    @property
    def directory(self) -> CallDirectory:
        """The service's call directory."""
        ...

    def response_homes(self, here: ResponsesHere) -> ResponseHomes | None:
        """Where response ids made elsewhere are found, answering the siblings' questions about
        this process's with ``here``; None when this process is the gateway. Before
        :meth:`start`."""
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

    async def cancel_group(self, group: str, reason: Reason) -> list[dict[str, object]]:
        return [a.to_json() for a in await self._registry.cancel_group(group, reason)]

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

    def response_homes(self, here: ResponsesHere) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def exposition(self) -> bytes:
        return generate_latest(self._metrics)

    async def pool_exposition(self) -> bytes:
        return generate_latest(self._pool)
