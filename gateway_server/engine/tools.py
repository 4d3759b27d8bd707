"""Tools at the engine seam: what the OpenAI layer asks of an engine about a request's ``tools``
and ``tool_choice``, and what it gets back. An engine that reads tool calls in its answers
implements :class:`ToolCalling` (vLLM's, with vLLM's own parsers: :mod:`.vllm.tools`); one that
does not refuses tools by field (the simulated engine's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway_server.engine.constraint import StructuredOutput


@dataclass(frozen=True, slots=True)
class ToolSettings:
    parser: str | None = None
    """``--tool-call-parser``: the name of one of vLLM's tool parsers."""
    auto: bool = False
    """``--enable-auto-tool-choice``."""


class ChoiceTools(Protocol):
    """Tool calls in one choice's answer: the parser's reading, with ``vllm serve``'s rules."""

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The whole answer's ``message`` and its finish reason."""
        ...

    def delta(self, text: str, finish: str | None) -> dict[str, Any] | None:
        """The ``delta`` for the next piece of the answer; None: nothing to send yet."""
        ...

    def stream_finish(self, finish: str) -> str:
        """The finish reason of a streamed choice (after its deltas went out)."""
        ...


class ChoiceParsers(Protocol):
    def choice(self) -> ChoiceTools:
        """A fresh parser for one choice of the answer (parsers keep state)."""
        ...


@dataclass(frozen=True)
class ToolPlan:
    """One request's tools: the template's ``tools``, the constraint that replaces the request's
    own (None: keep it), and, when answers are parsed, what parses each choice."""

    tool_dicts: list[dict[str, Any]] | None
    structured: StructuredOutput | None = None
    parsers: ChoiceParsers | None = None
    """None when answers are plain text."""
    skip_special_tokens: bool = True
    """False when the parser reads special tokens (``hermes``: its tags are special in some
    models)."""

    @property
    def parses(self) -> bool:
        """Whether answers go through the tool parser."""
        return self.parsers is not None

    def choice(self) -> ChoiceTools:
        """A fresh parser for one choice of the answer."""
        assert self.parsers is not None
        return self.parsers.choice()


class ToolCalling(Protocol):
    def plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """What to do about the request's tools; None when it names none. Raises
        RequestRejected naming the field, with ``vllm serve``'s refusals."""
        ...
