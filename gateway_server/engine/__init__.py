"""Engines: what turns a prompt into tokens. The gateway talks to them only through
:class:`~gateway_server.engine.base.Engine`; ``sim`` and ``vllm`` implement it, each in a package
of its own behind the seam (``base``, ``constraint``, ``tools``, ``handoff``, ``context``), and
:mod:`.table` says how ``--engine`` builds each one's workers.

Adding an engine (SGLang, say) is one package and one row:

1. ``engine/sglang/``: a class implementing :class:`~.base.Engine` (its ``features`` say which
   request fields it honours; what it cannot honour it refuses with ``RequestRejected`` naming
   the field), its settings (a frozen dataclass that checks its own values) and its flags
   (``Option`` s in the group ``"sglang"``), its mapping of the seam's values (sampling, the
   structured-output constraint) onto its own, and ``tool_calling`` (or the simulated engine's
   refusal of tools). To serve ``--worker-roles``, it implements
   :class:`~.handoff.DisaggregatedEngine` too.
2. ``engine/table.py``: a member of ``EngineName`` and its row: a factory from the
   :class:`~.context.EngineContext` (imported lazily when the engine is heavy), the default
   model, the settings class, the flags, and what it can do (``disaggregates``,
   ``tool_parsers``, ``faults``).

Nothing outside ``engine/`` changes: ``tests/pure/test_layers.py`` holds the package to that.
"""

from gateway_server.engine.base import (
    Engine,
    EngineDead,
    EngineError,
    EngineLoad,
    EngineRequest,
    FinishReason,
    SamplingParams,
    TokenChunk,
)

__all__ = [
    "Engine",
    "EngineDead",
    "EngineError",
    "EngineLoad",
    "EngineRequest",
    "FinishReason",
    "SamplingParams",
    "TokenChunk",
]
