"""Where each engine request runs, chosen once when the service starts (as the scope is).

- **whole** (:mod:`.whole`): on one worker, start to end: aggregated serving.
- **split** (:mod:`.split`): a prefill leg and a decode leg on two workers, the prompt's KV
  handed from one to the other (``--worker-roles``).

The service asks its :class:`Placer` for a :class:`Placement` per engine request and streams,
gives back, aborts and describes it through that; the registry aborts and describes it the same
way. Neither asks which placement it is. Nothing here imports the registry or the service: what
a runner needs of the request is passed in (:class:`Progress`).
"""

from __future__ import annotations

from gateway_server.engine.pool import EnginePool
from gateway_server.placement.base import Placement, Placer, Progress
from gateway_server.placement.split import SplitPlacer
from gateway_server.placement.whole import WholePlacer

__all__ = ["Placement", "Placer", "Progress", "placer_for"]


def placer_for(pool: EnginePool) -> Placer:
    """Split when the pool's workers have roles (``--worker-roles``), else whole."""
    return SplitPlacer(pool) if pool.disaggregated else WholePlacer(pool)
