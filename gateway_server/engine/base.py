"""The engine seam.

An engine runs engine requests (one prompt, one sequence of output tokens each). The gateway
never looks inside: it calls :meth:`Engine.generate` for a stream of :class:`TokenChunk`,
:meth:`Engine.abort` to stop one, and :meth:`Engine.phase` / :meth:`Engine.load` to report.

Contract every engine keeps:

- ``generate`` yields chunks in order; the last one has ``finish_reason`` set and nothing follows.
  A request that was aborted ends with a chunk whose ``finish_reason`` is ``ABORT``.
- ``abort`` is idempotent, never raises for an unknown or finished id, and returns once the engine
  has stopped working on the request (its batch slot and KV cache are free or being freed at the
  step boundary that applied the abort). The histogram ``cancel_to_abort_seconds`` measures it.
- An engine that fails raises :class:`EngineError` (or :class:`EngineDead` when it can serve no
  more) from ``generate``; it never leaves a consumer waiting forever.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hangup_contract.vocabulary import Phase

if TYPE_CHECKING:
    from gateway_server.structured import StructuredOutput


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    structured: StructuredOutput | None = None
    """A constraint on the output (JSON schema, regex, choice, grammar); None: free text."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text (vLLM's tool parsers that read them turn it off)."""


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    """Unique among the engine's live requests (the gateway derives it from the call id)."""
    prompt: str
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class TokenChunk:
    text: str
    """Text added since the previous chunk."""
    new_tokens: int
    """Output tokens added since the previous chunk."""
    prompt_tokens: int
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    waiting: int
    kv_cache_usage: float
    """Fraction of the KV cache in use, 0.0 to 1.0."""
    kv_cache_blocks: int
    """Blocks the KV cache holds (vLLM's ``num_gpu_blocks``); 0 while unknown."""
    block_size: int
    """Tokens per KV-cache block."""


class EngineError(Exception):
    """The engine failed this request."""


class EngineDead(EngineError):
    """The engine can serve no more requests (its process died, its device was lost)."""


class RequestRejected(EngineError):
    """The engine cannot run this request as asked (a client error: the gateway answers 400)."""


class NoChatTemplate(EngineError):
    """The model has no chat template: it cannot turn chat messages into a prompt."""


class Engine(Protocol):
    @property
    def max_model_len(self) -> int:
        """Most tokens (prompt + output) one request may hold."""
        ...

    @property
    def alive(self) -> bool:
        """False once the engine has died; the router stops sending it requests."""
        ...

    async def start(self) -> None:
        """Load and warm up. Raises :class:`EngineError` with a clear message on failure."""
        ...

    async def shutdown(self) -> None:
        """Stop; requests still running end with ``ABORT``."""
        ...

    def count_prompt_tokens(self, prompt: str) -> int: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The prompt for a chat (``role``/``content`` pairs), ending where the assistant speaks;
        ``tools`` (OpenAI's function definitions) are handed to the template as ``tools``.

        Raises :class:`NoChatTemplate` when the model has none."""
        ...

    def check(self, params: SamplingParams) -> None:
        """Raise :class:`RequestRejected`, naming the field, when the engine cannot honour
        ``params`` (a structured output it cannot compile, or does not do at all); cheap when
        there is nothing to check."""
        ...

    def tool_tokenizer(self) -> object | None:
        """The tokenizer vLLM's tool-call parsers read; None when the engine has none."""
        ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenChunk, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def phase(self, request_id: str) -> Phase | None:
        """Where the request is now, or None when the engine does not know it (finished)."""
        ...

    def load(self) -> EngineLoad: ...
