"""What an engine request's output must match: the seam's value for structured output.

Engine-neutral: :mod:`gateway_server.openai.structured` reads it from a request's
``response_format`` and ``structured_outputs`` fields; each engine maps it onto its own (the
vLLM engine onto ``StructuredOutputsParams``, in :mod:`~.vllm.inputs`) or refuses it
(``Engine.check``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

STRUCTURED_OUTPUTS = "structured_outputs"
"""vLLM's request field for a constraint: the field a constraint is named by unless it came from
another (``response_format``, ``tool_choice``)."""


class Constraint(enum.StrEnum):
    """What the output must match; the names are vLLM's ``StructuredOutputsParams`` fields."""

    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"
    STRUCTURAL_TAG = "structural_tag"
    """Only set by the gateway itself (vLLM's tool parsers constrain tool calls with one)."""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """One constraint on an engine request's output."""

    kind: Constraint
    value: str | tuple[str, ...] | bool
    """JSON text (``json``: the schema; ``structural_tag``), a pattern or grammar, the choices,
    or True (``json_object``)."""
    source: str = STRUCTURED_OUTPUTS
    """The request field it came from: what a refusal names."""
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
