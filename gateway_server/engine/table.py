"""The engines the gateway can run: ``--engine NAME`` picks a row of :data:`ENGINES`.

Adding an engine: a module that implements :class:`~.base.Engine`, a member of
:class:`EngineName` and its row here (how a worker's engine is made, what model name it serves when
``--model`` is not given, its flags). The row's factory imports its module when an engine whose
import is heavy (vLLM: seconds and much memory) is asked for, and only then. An engine with
flags has its settings built from their values by the row's ``settings``; the row's factory gets
them in its :class:`~.context.EngineContext`, never the gateway's whole configuration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from gateway_server.engine.context import EngineContext
from gateway_server.engine.pool import EngineFactory
from gateway_server.engine.sim.config import SimConfig
from gateway_server.engine.sim.engine import SimulatedEngine
from gateway_server.engine.sim.kv import SimKvStore
from gateway_server.engine.sim.options import SIM_OPTIONS
from gateway_server.engine.vllm.options import VLLM_OPTIONS, VllmOptions
from hangup_contract.runtime.options import Option


class EngineName(enum.StrEnum):
    """``--engine``'s values."""

    SIM = "sim"
    VLLM = "vllm"


@dataclass(frozen=True, slots=True)
class EngineKind:
    factory: Callable[[EngineContext], EngineFactory]
    """What makes worker *i*'s engine (called at start, and again when that worker's engine died).
    Raises EngineError when the engine cannot be had (a missing package, too few devices)."""
    default_model: str | None
    """The model name served without ``--model``; None: ``--model`` is required."""
    about: str
    """What it is, in ``--help``'s title of its flags."""
    settings: Callable[..., object]
    """Its settings from its flags' values (by field name)."""
    options: tuple[Option, ...]
    """Its flags; each one's ``group`` is the engine's name."""
    disaggregates: bool = False
    """Its engines implement :class:`~.handoff.DisaggregatedEngine`: they serve
    ``--worker-roles`` other than ``both``."""
    tool_parsers: bool = False
    """Its answers can be read by vLLM's tool parsers (``--tool-call-parser``)."""
    faults: bool = False
    """Its engines take injected faults (``--sim-faults``: tests and demos)."""


def _simulated(context: EngineContext) -> EngineFactory:
    settings = context.settings
    assert isinstance(settings, SimConfig)
    kv = SimKvStore()  # every worker's, a restarted one's too: where P/D legs find the KV
    return lambda index: SimulatedEngine(settings, kv)


def _vllm(context: EngineContext) -> EngineFactory:
    assert isinstance(context.settings, VllmOptions) and context.model is not None
    # Imported only when asked for: importing vLLM takes seconds and a lot of memory.
    if context.disaggregated:  # prefill and decode workers, with a KV connector
        vllm_pd: Any = import_module("gateway_server.engine.vllm.pd")
        pd_factory: EngineFactory = vllm_pd.pd_factory(context)
        return pd_factory
    vllm: Any = import_module("gateway_server.engine.vllm.factory")
    factory: EngineFactory = vllm.vllm_engine_factory(
        context.model, context.settings, context.workers
    )
    return factory


ENGINES: Mapping[EngineName, EngineKind] = {
    EngineName.SIM: EngineKind(
        _simulated,
        "hangup-sim",
        "Simulated engine",
        SimConfig,
        SIM_OPTIONS,
        disaggregates=True,
        faults=True,
    ),
    EngineName.VLLM: EngineKind(
        _vllm,
        None,
        "vLLM engine",
        VllmOptions,
        VLLM_OPTIONS,
        disaggregates=True,
        tool_parsers=True,
    ),
}


def engine_kind(name: str) -> EngineKind:
    return ENGINES[EngineName(name)]


def engine_factory(name: str, context: EngineContext) -> EngineFactory:
    """Makes the engine of worker *i* (a new one each call: at start, and when one died)."""
    return engine_kind(name).factory(context)
