"""Which devices each vLLM worker sees (no vLLM import at module load).

On a machine with GPUs, worker *i* gets ``tensor_parallel_size`` of the visible devices, through
the platform's device variable (e.g. ``CUDA_VISIBLE_DEVICES``) set while that worker's engine
core is spawned; the variable is process-wide, so workers start one after another under a lock.
Without GPUs (vLLM's CPU build) no variable is set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from typing import Any

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


def visible_devices() -> tuple[str | None, list[str]]:
    """The platform's device variable and the device ids it makes visible (none on CPU)."""
    platforms: Any = import_module("vllm.platforms")
    platform = platforms.current_platform
    if not platform.is_cuda_alike():
        return None, []
    var = str(platform.device_control_env_var)
    current = os.environ.get(var, "")
    ids = [d for d in current.split(",") if d] if current else []
    return var, ids or [str(i) for i in range(platform.device_count())]


@dataclass(frozen=True, slots=True)
class DevicePin:
    """The devices of one worker, and the variable that makes only them visible."""

    var: str
    ids: tuple[str, ...]


@contextlib.contextmanager
def device_env(pin: DevicePin | None) -> Iterator[None]:
    """Set ``pin.var`` to ``pin.ids`` for the block (an engine core spawned inside inherits
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
