"""The calls in flight and the draining flag: state owned by one ``ServerState`` per process.

Every listener registers each call it relays (``admit``), names the task that handles it
(``Call.task``: ``Call.stop`` interrupts it with a reason), and releases it when it is done.
Shutdown uses the same registry: stop admitting, wait until nothing is in flight or the drain
timeout passes, then stop what is left with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from hangup_contract.cancel_labels import Reason
from hangup_contract.usage import Usage
from proxy.calls.groups import GroupBounds
from proxy.calls.held import Bounds, Ender, HeldCalls, Holding
from proxy.calls.siblings import Siblings
from proxy.cancel.canceller import Canceller
from proxy.config import Config
from proxy.errors import DuplicateRequestId, Overloaded, WorkerSilent
from proxy.labels import CallProtocol, CancelResult, Outcome, Stage
from proxy.metrics import ProxyMetrics


@dataclass(eq=False, slots=True)
class Call:
    """One client call relayed upstream; filled in as it goes, logged once when it ends."""

    protocol: CallProtocol
    method: str
    path: str
    client_addr: str | None
    started: float = field(default_factory=time.monotonic)
    request_id: str | None = None  # the upstream call's id (what cancel calls name)
    client_request_id: str | None = None
    group: str | None = None  # its job (X-Hangup-Group), held with the call (proxy.calls.groups)
    answer_id: str | None = None  # its answer's own id, read once (proxy.http.answer_ids)
    model: str | None = None  # the model its answer names, read with that id
    streaming: bool | None = None  # an event stream (HTTP: its answer; gRPC: a stream method)
    status: int | None = None  # what the client was told (None: nothing was sent)
    outcome: Outcome | None = None
    stage: Stage = Stage.BEFORE_RESPONSE
    reason: Reason | None = None  # why the proxy cancelled the call, if it did
    error: str | None = None
    upstream_ttfb: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    chunks_out: int = 0
    """Pieces of the answer relayed to the client: gRPC messages; over HTTP, the body's writes,
    one per read of the upstream (a stream of tokens that arrive one at a time: one per SSE
    event; events that arrive together: one for them all). Not events: counting those would
    mean scanning every byte relayed (``docs/proxy.md``, "What a cancelled call used")."""
    usage: Usage | None = None
    """A call that ended cancelled: what the server said it used, where it sent its own usage
    (``proxy.http.relayed``; hangup's trailing metadata over gRPC). Read once, at its end."""
    ended: float | None = None
    stopped_at: float | None = None  # when the hang-up (or limit, or shutdown) was seen
    cancel_result: CancelResult | None = None
    cancel_answered_at: float | None = None
    task: asyncio.Task[Any] | None = None  # what handles the call (set by its listener)
    detached: bool = False  # meant to outlive its client: no cancel call (proxy.cancel.responses)
    holding: Holding | None = None  # its ids in the calls by id (proxy.calls.held), if held

    def stop(self, reason: Reason) -> None:
        """Interrupt the call for ``reason`` (both listeners: its task cancelled). The first stop
        records its reason; a later one does nothing, the call is ending."""
        if self.reason is None and self.task is not None:
            self.reason = reason
            self.task.cancel()

    def listed(self, now: float) -> dict[str, object]:
        """What the sidecar's list of calls says of this one (``GET /v2/sidecar/requests``)."""
        return {
            "request_id": self.request_id,
            "client_request_id": self.client_request_id,
            "answer_id": self.answer_id,
            "group": self.group,
            "model": self.model,
            "protocol": self.protocol.value,
            "method": self.method,
            "path": self.path[:LISTED_PATH],
            "stage": self.stage.value,
            "streaming": self.streaming,
            "age_s": round(now - self.started, 3),
        }

    def record(self) -> dict[str, object]:
        """The structured log fields for this call."""
        ended = self.ended if self.ended is not None else time.monotonic()
        return {
            "request_id": self.request_id,
            "client_request_id": self.client_request_id,
            "group": self.group,
            "protocol": self.protocol.value,
            "method": self.method,
            "path": self.path,
            "client": self.client_addr,
            "status": self.status,
            "outcome": self.outcome.value if self.outcome else None,
            "stage": self.stage.value,
            "reason": self.reason.value if self.reason else None,
            "cancel_result": self.cancel_result.value if self.cancel_result else None,
            "detached": self.detached,
            "error": self.error,
            "duration_ms": round((ended - self.started) * 1000, 3),
            "upstream_ttfb_ms": None
            if self.upstream_ttfb is None
            else round(self.upstream_ttfb * 1000, 3),
            "cancel_ms": _ms(self.stopped_at, self.cancel_answered_at),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "chunks_out": self.chunks_out,
            "usage": self.usage.to_json() if self.usage is not None else None,
        }


LISTED_PATH = 200  # characters of a call's path its listing shows
LIST_MOST = 1000  # calls one listing shows at most (of each worker, and in all)


def held_bounds(config: Config) -> Bounds:
    """What the proxy remembers of ids, from its flags."""
    return Bounds(
        config.tombstone_ttl,
        config.ended_ids_max,
        config.ended_ids_max_bytes,
        config.tombstones_max,
        config.tombstones_max_bytes,
    )


def group_bounds(config: Config) -> GroupBounds:
    """What the proxy holds of groups, and remembers of groups cancelled, from its flags."""
    return GroupBounds(
        config.max_groups,
        config.max_group_calls,
        config.tombstones_max,
        config.tombstones_max_bytes,
        config.tombstone_ttl,
    )


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000, 3)


class ServerState:
    """Owns the calls in flight, the draining flag and the shared services they use."""

    def __init__(self, config: Config, metrics: ProxyMetrics, canceller: Canceller) -> None:
        self.config = config
        self.metrics = metrics
        self.canceller = canceller
        # The calls by id: for the proxy's own cancel by id (on with a token), and to refuse a
        # trusted id another call holds (--trust-client-request-id).
        self.held = (
            HeldCalls(
                held_bounds(config),
                trust_client=config.trust_client_request_id,
                groups=group_bounds(config),
            )
            if config.cancel_token is not None or config.trust_client_request_id
            else None
        )
        self.siblings: Siblings | None = None  # with --workers: the other workers (Server sets)
        self.draining = False
        self._calls: set[Call] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def inflight(self) -> int:
        return len(self._calls)

    def admit(self, call: Call) -> None:
        """Register ``call``; raises ``Overloaded`` when draining or at --max-concurrent-streams."""
        if self.draining:
            raise Overloaded("the proxy is shutting down")
        limit = self.config.max_concurrent_streams
        if limit and len(self._calls) >= limit:
            raise Overloaded(f"more than {limit} concurrent streams")
        self._calls.add(call)
        self._idle.clear()
        self.metrics.admitted(call.protocol)

    def hold(self, call: Call, ender: Ender) -> bool:
        """Hold ``call`` by its ids, when the proxy holds calls (``proxy.calls.held``; raises
        ``CancelledById`` or ``DuplicateRequestId`` as ``HeldCalls.hold``). True when the other
        workers must be asked about its id before it goes upstream (:meth:`hold_everywhere`)."""
        if self.held is None:
            return False
        call.holding = self.held.hold(call, ender)
        return call.holding.trusted and self.siblings is not None

    async def hold_everywhere(self, call: Call) -> None:
        """With ``--workers``: refuse the call's trusted id when another worker holds it
        (``DuplicateRequestId``), or did not say in time (``WorkerSilent``, 503: it may). The id
        is held here before the others are asked, so of two calls under one id at two workers
        at once, at least one sees the other (both may be refused; never both run)."""
        holding, siblings, held = call.holding, self.siblings, self.held
        assert holding is not None and siblings is not None and held is not None
        request_id = holding.key
        answers = await siblings.ask("held", request_id)
        if "held" in answers:
            error: DuplicateRequestId | WorkerSilent = DuplicateRequestId(
                f"request id {request_id!r} is already in flight"
            )
        elif None in answers:
            error = WorkerSilent(f"a worker did not say whether it holds request id {request_id!r}")
        else:
            return
        held.drop(holding)
        call.holding = None
        raise error

    def listing(self, group: str | None = None) -> list[dict[str, object]]:
        """The calls in flight here (of ``group``, if given), as the sidecar's list shows them,
        at most ``LIST_MOST``."""
        now, listed = time.monotonic(), []
        for call in self._calls:
            if call.request_id is not None and (group is None or call.group == group):
                listed.append(call.listed(now))
                if len(listed) >= LIST_MOST:
                    break
        return listed

    def release(self, call: Call) -> None:
        if call.holding is not None and self.held is not None:
            self.held.release(call.holding)
            call.holding = None
        if call in self._calls:
            self._calls.discard(call)
            self.metrics.released(call.protocol)
        if not self._calls:
            self._idle.set()
            self.metrics.quiet()

    async def wait_idle(self, within: float) -> bool:
        """True when no call is in flight within ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def stop_all(self, reason: Reason) -> int:
        """Interrupt every call in flight with ``reason``; returns how many were stopped."""
        stopped = 0
        for call in list(self._calls):
            if call.task is not None:
                call.stop(reason)
                stopped += 1
        return stopped
