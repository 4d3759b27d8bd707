"""The devices vLLM sees (no vLLM import at module load): the platform's device variable and
the ids it makes visible. How they are split among workers: :mod:`.devices`."""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any


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
