"""Engines: what turns a prompt into tokens. The gateway talks to them only through
:class:`~gateway_server.engine.base.Engine`; ``sim`` and ``vllm`` implement it, and
:mod:`.table` says how ``--engine`` builds each one's workers."""

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
