"""Liveness: whether this gateway process can still serve, or Kubernetes should restart it.

Readiness (``/v2/health/ready``) says whether a worker serves now; liveness
(``/v2/health/live``, gRPC ``ServerLive``) fails only for what a restart of the container would
cure and waiting would not:

- an engine worker down for longer than ``--engine-down-limit`` (its restarts keep failing, see
  ``gateway_server.engine.pool``);
- an event loop that stopped running for longer than ``--loop-stall-limit``.

A health endpoint served by a stuck loop cannot answer at all, and the kubelet's probe then
fails by its own timeout. The harder case is a loop that is blocked for long stretches and runs
in between: probes that land in between would pass. So a task in the loop writes a heartbeat
every ``beat`` seconds, and a watchdog *thread* (it runs while the loop is blocked) measures
how late it is (:mod:`hangup_contract.runtime.watchdog`; a stall past ``--loop-stall-log`` is
logged with its stack and counted in ``hangup_gateway_event_loop_stalls_total``). A stall past
the limit is logged as an error, and liveness fails from then until as long again has passed
after the loop ran again: a loop that keeps stalling fails every probe; one stall fails the
probes of one limit's worth of time.
"""

from __future__ import annotations

from collections.abc import Callable

from hangup_contract.runtime.watchdog import LoopWatchdog

__all__ = ["LoopWatchdog", "liveness"]


def liveness(
    down_for: Callable[[], float], down_limit: float, loop: LoopWatchdog
) -> Callable[[], str | None]:
    """The liveness check: None while live, else why not."""

    def problem() -> str | None:
        down = down_for()
        if down_limit > 0 and down > down_limit:
            return (
                f"an engine worker has been down for {down:.0f} s and could not be started "
                f"again (--engine-down-limit {down_limit:g} s)"
            )
        return loop.problem()

    return problem
