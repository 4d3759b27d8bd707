"""Engine workers, the router in front of them, and what starts a dead one again.

Each worker is one engine. A request goes to the live worker with the fewest requests the gateway
has in flight on it (the gateway's own count: exact, and free of the lag of engine statistics);
ties go to the lowest index. With roles (``--worker-roles``, :mod:`.handoff`) each leg of a
disaggregated call goes to the least-loaded live worker whose role serves that leg: a worker's
``in_flight`` counts the legs it runs. The caller remembers the engine it got, so a cancel
reaches the engine that owns the request, even after its worker got a new one.

Restarts. Given an engine factory, the pool keeps each worker's engine alive: a keeper task per
worker looks at its engine every ``poll_s`` and, once it has died, (1) shuts the dead engine down
(its requests in flight have already failed with :class:`~.base.EngineDead`; shutting down releases
what it left: vLLM's engine processes and their memory), (2) logs why it died (known best once its
processes are gone: their exit status, vLLM's last error line), (3) builds a new engine for the
same worker index (same devices) and starts it, the first attempt at once and each failed one
followed by a wait doubling from ``backoff_s`` up to ``backoff_max_s``. The worker is out of the
routing from its death until the new engine is ready; the others serve meanwhile. ``down_for()``
tells liveness how long the longest-down worker has been down. A restart still under way when the
pool shuts down is cancelled; the pool's shutdown returns once the engine being started has stopped
(vLLM loads in a thread that cannot be interrupted: the engine waits for it, then stops what it
made).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway_server.engine.base import Engine, EngineError, EngineLoad, NoLiveWorker
from gateway_server.engine.handoff import WorkerRole, check_roles, disaggregated
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")

EngineFactory = Callable[[int], Engine]
"""A new, unstarted engine for the worker of this gateway-wide index (its devices included)."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    backoff_s: float = 1.0
    """Wait after the first failed restart; it doubles after each further failure."""
    backoff_max_s: float = 30.0
    poll_s: float = 0.1
    """How often a keeper looks whether its engine still lives."""
    shutdown_timeout_s: float = 60.0
    """How long the dead engine's shutdown may take before the new one starts anyway."""

    def delay(self, failures: int) -> float:
        """The wait before restart attempt ``failures + 1``: none for the first."""
        if failures == 0:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1)))


@dataclass(eq=False)
class Worker:
    index: int
    engine: Engine
    role: WorkerRole = WorkerRole.BOTH
    in_flight: int = 0
    down_since: float | None = None
    """``time.monotonic()`` when its engine was seen dead; None while it serves."""

    @property
    def name(self) -> str:
        return str(self.index)

    def load(self) -> EngineLoad:
        """The engine's load; idle while it is dead (what a dead engine held is gone)."""
        load = self.engine.load()
        if self.engine.alive:
            return load
        return EngineLoad(0, 0, 0.0, load.kv_cache_blocks, load.block_size)


class EnginePool:
    def __init__(
        self,
        engines: list[Engine],
        first_index: int = 0,
        *,
        factory: EngineFactory | None = None,
        policy: RestartPolicy | None = None,
        on_restart: Callable[[Worker], None] = lambda worker: None,
        roles: tuple[WorkerRole, ...] | None = None,
    ) -> None:
        """``first_index``: the gateway-wide index of the first worker (an API process's share
        of the workers starts there). Without ``factory`` a dead engine stays dead.
        ``on_restart`` runs once a worker serves again on a new engine (metrics). ``roles``:
        one per engine (default: every worker ``both``). Raises ValueError for no engine, or
        roles that do not fit (see :func:`~.handoff.check_roles`)."""
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        roles = roles or (WorkerRole.BOTH,) * len(engines)
        if len(roles) != len(engines):
            raise ValueError(f"{len(roles)} worker roles for {len(engines)} engines")
        check_roles(roles)
        pairs = enumerate(zip(engines, roles, strict=True))
        self.workers = [Worker(first_index + i, e, role) for i, (e, role) in pairs]
        self.disaggregated = disaggregated(roles)
        """Whether calls run as a prefill leg and a decode leg
        (:mod:`gateway_server.placement.split`)."""
        self.factory = factory
        self.policy = policy or RestartPolicy()
        self._on_restart = on_restart
        self._keepers: list[asyncio.Task[None]] = []
        self._clock = time.monotonic

    @property
    def ready(self) -> bool:
        """A worker is alive; disaggregated, one that prefills and one that decodes."""
        live = [w.role for w in self.workers if w.engine.alive]
        if self.disaggregated:
            return any(r.prefills for r in live) and any(r.decodes for r in live)
        return bool(live)

    def down_for(self) -> float:
        """Seconds the worker down longest has been down (0 when every worker serves)."""
        since = [w.down_since for w in self.workers if w.down_since is not None]
        return self._clock() - min(since) if since else 0.0

    async def start(self) -> None:
        """Start every worker; if one fails, stop the others and raise naming the worker."""
        results = await asyncio.gather(
            *(w.engine.start() for w in self.workers), return_exceptions=True
        )
        failures = [(w, r) for w, r in zip(self.workers, results, strict=True) if r is not None]
        if failures:
            await self.shutdown()
            worker, exc = failures[0]
            raise EngineError(f"engine worker {worker.index} failed to start: {exc}") from exc
        if self.factory is not None:
            self._keepers = [asyncio.create_task(self._keep(w)) for w in self.workers]

    async def shutdown(self) -> None:
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        await asyncio.gather(*(w.engine.shutdown() for w in self.workers), return_exceptions=True)

    def acquire(self, leg: WorkerRole = WorkerRole.BOTH) -> Worker:
        """The least-loaded live worker that serves ``leg`` (``PREFILL``, ``DECODE``, or
        ``BOTH``: a whole request, any worker), its in-flight count raised; pair with
        :meth:`release`.

        Raises :class:`~.base.NoLiveWorker` when no such worker is alive.
        """
        live = [w for w in self.workers if w.engine.alive and _serves(w.role, leg)]
        if not live:
            if leg is WorkerRole.BOTH:
                raise NoLiveWorker("no engine worker is alive")
            raise NoLiveWorker(f"no engine worker that can {leg.value} is alive")
        worker = min(live, key=lambda w: (w.in_flight, w.index))
        worker.in_flight += 1
        return worker

    def release(self, worker: Worker) -> None:
        worker.in_flight -= 1

    # -- restarts --------------------------------------------------------------------------

    async def _keep(self, worker: Worker) -> None:
        while True:
            # Polled: vLLM learns of its core's death in a thread of its own, setting a flag.
            while worker.engine.alive:  # noqa: ASYNC110
                await asyncio.sleep(self.policy.poll_s)
            await self._restart(worker)

    async def _restart(self, worker: Worker) -> None:
        """Replace ``worker``'s dead engine; returns once a new one serves (retrying forever:
        liveness reads ``down_for`` to give up on the container instead)."""
        dead, in_flight = worker.engine, worker.in_flight
        worker.down_since = self._clock()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.policy.shutdown_timeout_s):
                await dead.shutdown()
        log_event(
            log,
            "engine_worker_died",
            logging.ERROR,
            worker=worker.index,
            cause=dead.death_cause or "unknown",
            in_flight=in_flight,
            cleanup_s=round(self._clock() - worker.down_since, 3),
        )
        failures = 0
        while True:
            await asyncio.sleep(self.policy.delay(failures))
            assert self.factory is not None
            engine = self.factory(worker.index)
            try:
                await engine.start()
            except Exception as exc:
                failures += 1
                log_event(
                    log,
                    "engine_worker_restart_failed",
                    logging.ERROR,
                    worker=worker.index,
                    attempt=failures,
                    error=str(exc),
                    retry_in_s=self.policy.delay(failures),
                )
                with contextlib.suppress(Exception):
                    await engine.shutdown()
                continue
            break
        took = self._clock() - worker.down_since
        worker.engine, worker.down_since = engine, None
        self._on_restart(worker)
        log_event(
            log,
            "engine_worker_restarted",
            worker=worker.index,
            attempts=failures + 1,
            restart_s=round(took, 3),
        )


def _serves(role: WorkerRole, leg: WorkerRole) -> bool:
    if leg is WorkerRole.PREFILL:
        return role.prefills
    if leg is WorkerRole.DECODE:
        return role.decodes
    return True
