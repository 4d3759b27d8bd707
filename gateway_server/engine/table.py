"""The engines the gateway can run: ``--engine NAME`` picks a row of :data:`ENGINES`.

Adding an engine: a module that implements :class:`~.base.Engine`, a member of
:class:`EngineName` and its row here (how its workers are built, what model name it serves when
``--model`` is not given). The row's factory imports its module when an engine whose import is
heavy (vLLM: seconds and much memory) is asked for, and only then.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from gateway_server.engine.base import Engine
from gateway_server.engine.sim import SimulatedEngine

if TYPE_CHECKING:
    from gateway_server.config import GatewayConfig


class EngineName(enum.StrEnum):
    """``--engine``'s values."""

    SIM = "sim"
    VLLM = "vllm"


@dataclass(frozen=True, slots=True)
class EngineKind:
    build: Callable[[GatewayConfig, Sequence[int]], list[Engine]]
    """The workers of the given gateway-wide indices (an API process's share of them).
    Raises EngineError when they cannot be built (a missing package, too few devices)."""
    default_model: str | None
    """The model name served without ``--model``; None: ``--model`` is required."""


def _simulated(config: GatewayConfig, indices: Sequence[int]) -> list[Engine]:
    return [SimulatedEngine(config.sim) for _ in indices]


def _vllm(config: GatewayConfig, indices: Sequence[int]) -> list[Engine]:
    vllm: Any = import_module("gateway_server.engine.vllm")
    engines: list[Engine] = vllm.build_vllm_engines(
        config.model, config.vllm, config.workers, indices
    )
    return engines


ENGINES: Mapping[EngineName, EngineKind] = {
    EngineName.SIM: EngineKind(_simulated, default_model="hangup-sim"),
    EngineName.VLLM: EngineKind(_vllm, default_model=None),
}


def engine_kind(name: str) -> EngineKind:
    return ENGINES[EngineName(name)]


def build_engines(config: GatewayConfig, indices: Sequence[int] | None = None) -> list[Engine]:
    """The engine workers (only those of ``indices``, an API process's share, when given)."""
    kind = engine_kind(config.engine)
    return kind.build(config, range(config.workers) if indices is None else indices)
