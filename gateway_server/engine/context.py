"""What an engine row of :mod:`~.table` builds its workers' engines from.

The gateway's configuration stays above the engine package: a row sees only this small record,
so no engine module imports the gateway's config (which imports the table of engines).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway_server.engine.handoff import WorkerRole, disaggregated


@dataclass(frozen=True, slots=True)
class EngineContext:
    """The gateway's choices an engine reads, and the row's own settings."""

    model: str | None
    """``--model``: a local path or a model name (None: the row's default model)."""
    workers: int
    roles: tuple[WorkerRole, ...]
    """Each worker's role, one per worker."""
    settings: object
    """The row's settings, built from its flags (``SimConfig``, ``VllmOptions``)."""

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode legs on different workers."""
        return disaggregated(self.roles)
