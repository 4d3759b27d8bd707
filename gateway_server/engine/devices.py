"""Which devices each engine worker sees, whatever the engine.

On a machine with GPUs, worker *i* gets its own group of the visible devices (as many as one
engine spans: vLLM's ``tensor_parallel_size``), through the platform's device variable (e.g.
``CUDA_VISIBLE_DEVICES``) set while that worker's engine process is spawned. The variable is
process-wide, so workers start one after another under a lock the engine holds. Which variable,
and which devices are visible, is the engine's to say (vLLM's: :mod:`.vllm.devices`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from gateway_server.engine.base import EngineError


def device_groups(workers: int, per_worker: int, visible: list[str]) -> list[tuple[str, ...]]:
    """Split the visible devices into ``workers`` groups of ``per_worker``.

    Raises EngineError when there are too few devices.
    """
    needed = workers * per_worker
    if needed > len(visible):
        raise EngineError(
            f"{workers} worker(s) x tensor parallel size {per_worker} need {needed} GPU(s); "
            f"{len(visible)} visible ({','.join(visible) or 'none'})"
        )
    return [tuple(visible[i * per_worker : (i + 1) * per_worker]) for i in range(workers)]


@dataclass(frozen=True, slots=True)
class DevicePin:
    """The devices of one worker, and the variable that makes only them visible."""

    var: str
    ids: tuple[str, ...]


@contextlib.contextmanager
def device_env(pin: DevicePin | None) -> Iterator[None]:
    """Set ``pin.var`` to ``pin.ids`` for the block (an engine process spawned inside inherits
    it), then restore the variable as it was. Not thread-safe: callers hold the spawn lock."""
    if pin is None:
        yield
        return
    saved = os.environ.get(pin.var)
    os.environ[pin.var] = ",".join(pin.ids)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(pin.var, None)
        else:
            os.environ[pin.var] = saved
