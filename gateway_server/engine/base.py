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
- What a request consumed (its prompt's tokens, the tokens generated, when it left the queue)
  is written to its :class:`Consumption` as it runs, and is complete once ``generate`` has
  ended or ``abort`` has returned, whether or not the consumer read the last chunk.
- An engine that fails raises :class:`EngineError` (or :class:`EngineDead` when it can serve no
  more) from ``generate``; it never leaves a consumer waiting forever. A dead engine answers
  ``abort`` at once and reports an idle ``load``; the pool (:mod:`.pool`) replaces it with a new
  one.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway_server.engine.constraint import StructuredOutput
from gateway_server.engine.tools import ToolCalling, ToolSettings
from hangup_contract.cancel_labels import Phase


class Feature(enum.StrEnum):
    """What an engine can honour beyond plain sampling (``temperature``, ``top_p``, ``seed``,
    stop strings, ``max_tokens``); the OpenAI layer refuses a request field naming a feature its
    engine lacks (:mod:`gateway_server.openai.fields`)."""

    TOP_K = "top_k"
    MIN_P = "min_p"
    PENALTIES = "presence, frequency and repetition penalties"
    LOGIT_BIAS = "logit_bias"
    STOP_TOKEN_IDS = "stop_token_ids"
    MIN_TOKENS = "min_tokens"
    LOGPROBS = "log-probabilities of output tokens"
    PROMPT_LOGPROBS = "log-probabilities of prompt tokens"
    ECHO = "echo of the prompt"
    TOKEN_PROMPTS = "prompts as token ids"
    STRUCTURED = "structured output"
    TOOLS = "tools"


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
    top_k: int = 0
    """0 (or -1): every token."""
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs added to the logits."""
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    """Leave special tokens out of the text (vLLM's tool parsers that read them turn it off)."""
    logprobs: int | None = None
    """Log-probabilities of each output token and of this many top candidates; None: none."""
    prompt_logprobs: int | None = None
    """The same for each prompt token (the first has none); None: none."""
    structured: StructuredOutput | None = None
    """A constraint on the output (JSON schema, regex, choice, grammar); None: free text."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability and the engine's candidates at its position, in the engine's
    order (vLLM's: the chosen token first, then the top ones). ``logprob`` is None where the
    engine has none (a prompt's first token)."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """How a chat becomes a prompt (vLLM's names)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    """More variables for the chat template; those it does not use change nothing."""
    tools: tuple[dict[str, Any], ...] | None = None
    """OpenAI's function definitions, handed to the template as ``tools``; None: no tools."""


@dataclass(frozen=True, slots=True)
class Share:
    """Whose turn an engine request waits for in an admission queue that the gateway keeps:
    its client's among the clients, then its call's among that client's calls (:mod:`.fair`;
    docs/security.md, "Fair shares"). vLLM's scheduler keeps its own queue and ignores it."""

    client: str = ""
    """Who sent the call (``gateway_server.clients``); "" for every request that names none."""
    call: str = ""
    """The call id: one HTTP request or one gRPC call, however many engine requests it holds."""


@dataclass(eq=False, slots=True)
class Consumption:
    """What an engine request consumed, as its engines count it; written by them as it runs and
    when it ends, however it ends, and read by the gateway once ``generate`` is over or a
    cancel was applied (an aborted request's last chunk may never be read: its consumer left,
    so the counts cannot travel in chunks alone).

    One per engine request; a request served split shares it between its legs (the prefill
    leg's engine writes no output tokens to it). Times are ``time.perf_counter()`` readings.
    """

    prompt_tokens: int = 0
    """The prompt's tokens as the engine counted them (0 until it has)."""
    output_tokens: int = 0
    """Tokens the engine generated, whether or not their chunks were read."""
    admitted_at: float | None = None
    """When it left the engine's waiting queue (for a split request: its prefill leg's), as
    the engine's ``phase`` tells ``queued`` from ``prefill``; None while it waits. Set once."""
    prefilled_at: float | None = None
    """Split requests: when the prefill leg ended with the prompt's KV held (``transfer``)."""

    def admitted(self, now: float) -> None:
        """It left the waiting queue at ``now`` (a later admission, a decode leg's, is not)."""
        if self.admitted_at is None:
            self.admitted_at = now


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    """Unique among the engine's live requests (the gateway derives it from the call id)."""
    prompt: str | tuple[int, ...]
    """Text, or token ids (engines with ``Feature.TOKEN_PROMPTS``)."""
    params: SamplingParams
    share: Share = Share()
    consumption: Consumption = field(default_factory=Consumption)
    """Where the engine writes what the request consumed (the gateway's, read after)."""


@dataclass(frozen=True, slots=True)
class TokenChunk:
    text: str
    """Text added since the previous chunk."""
    new_tokens: int
    """Output tokens added since the previous chunk."""
    prompt_tokens: int
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    """One per token added, when the request asked for them."""
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    """On the first chunk, one per prompt token, when the request asked for them."""


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


class EngineRefused(EngineError):
    """The engine refused the request's parameters (the client's fault: answered 400)."""


class EngineDead(EngineError):
    """The engine can serve no more requests (its process died, its device was lost)."""


class NoFaults(Exception):
    """The engine takes no injected faults (only the simulated engine does)."""


class NoLiveWorker(EngineError):
    """No live engine worker can take the request (each one that could is down): the gateway
    answers 503, as when it drains."""


class RequestRejected(EngineError):
    """The engine cannot run this request as asked (a client error: the gateway answers 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        """The request field it names, if one."""


class NoChatTemplate(EngineError):
    """The model has no chat template: it cannot turn chat messages into a prompt."""


class Engine(Protocol):
    name: str
    """How a client is told which engine refused something ("the simulated engine")."""
    features: frozenset[Feature]
    """What this engine honours beyond plain sampling (see :class:`Feature`)."""

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1`` (0 while not started)."""
        ...

    @property
    def max_model_len(self) -> int:
        """Most tokens (prompt + output) one request may hold."""
        ...

    @property
    def alive(self) -> bool:
        """False once the engine has died; the router stops sending it requests."""
        ...

    @property
    def death_cause(self) -> str:
        """Why the engine died, for the log line of its restart (an exit status, a signal, an
        error); "" while it lives or when nothing is known."""
        ...

    async def start(self) -> None:
        """Load and warm up. Raises :class:`EngineError` with a clear message on failure."""
        ...

    async def shutdown(self) -> None:
        """Stop; requests still running end with ``ABORT``. On a dead engine: release what it
        left (its processes, their memory), so a new engine can take its devices."""
        ...

    def count_prompt_tokens(self, prompt: str | tuple[int, ...]) -> int: ...

    def prompt_text(self, prompt: str | tuple[int, ...]) -> str:
        """The prompt as text (token ids decoded as they are, special tokens included): what an
        echo of it shows."""
        ...

    def apply_chat_template(self, messages: list[dict[str, Any]], options: ChatOptions) -> str:
        """The prompt for a chat (``role``/``content`` messages, ``name`` and ``tool_call_id``
        where given), ending where the assistant speaks (``options`` may say otherwise); the
        options' ``tools`` are handed to the template as ``tools``.

        Raises :class:`NoChatTemplate` when the model has none, ``ValueError`` when the options
        cannot apply (continuing a chat whose last message is not the assistant's)."""
        ...

    def check(self, params: SamplingParams) -> None:
        """Raise :class:`RequestRejected`, naming the field, when the engine cannot honour
        ``params`` (a structured output it cannot compile, or does not do at all); cheap when
        there is nothing to check."""
        ...

    def tool_calling(self, settings: ToolSettings, model: str) -> ToolCalling:
        """How requests' tools are read (``--tool-call-parser``): a started engine's. Raises
        EngineError when the parser is unknown or cannot read the model's tokenizer."""
        ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[TokenChunk, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def phase(self, request_id: str) -> Phase | None:
        """Where the request is now, or None when the engine does not know it (finished)."""
        ...

    def load(self) -> EngineLoad: ...

    def inject_fault(self, fault: str) -> None:
        """Make the engine fail as named, for tests and demos (``--sim-faults``). Raises
        NoFaults when the engine takes none, ValueError for a fault it does not know."""
        ...
