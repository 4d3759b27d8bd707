"""Engine workers and the router in front of them.

Each worker is one engine. A request goes to the live worker with the fewest requests the gateway
has in flight on it (the gateway's own count: exact, and free of the lag of engine statistics);
ties go to the lowest index. The caller remembers the worker it got, so a cancel reaches the
engine that owns the request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway_server.engine.base import Engine, EngineError
from gateway_server.errors import Unavailable


@dataclass(eq=False)
class Worker:
    index: int
    engine: Engine
    in_flight: int = 0

    @property
    def name(self) -> str:
        return str(self.index)


class EnginePool:
    def __init__(self, engines: list[Engine], first_index: int = 0) -> None:
        """``first_index``: the gateway-wide index of the first worker (an API process's share
        of the workers starts there)."""
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.workers = [Worker(first_index + i, e) for i, e in enumerate(engines)]

    @property
    def ready(self) -> bool:
        return any(w.engine.alive for w in self.workers)

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

    async def shutdown(self) -> None:
        await asyncio.gather(*(w.engine.shutdown() for w in self.workers), return_exceptions=True)

    def acquire(self) -> Worker:
        """The least-loaded live worker, its in-flight count raised; pair with :meth:`release`.

        Raises :class:`~gateway_server.errors.Unavailable` when no worker is alive.
        """
        live = [w for w in self.workers if w.engine.alive]
        if not live:
            raise Unavailable("no engine worker is alive")
        worker = min(live, key=lambda w: (w.in_flight, w.index))
        worker.in_flight += 1
        return worker

    def release(self, worker: Worker) -> None:
        worker.in_flight -= 1
