"""What a call consumed, in OpenAI's ``usage`` shape: ``{"prompt_tokens", "completion_tokens",
"total_tokens"}``.

The gateway writes it wherever a cancelled call still has a reader (the cancel answer, the 499
body, a cancelled stream's last event, a gRPC call's trailing metadata :data:`METADATA_KEY`);
the sidecar reads it from what a server relayed. Both sides encode and read it here:
:meth:`Usage.to_json` writes the shape, :func:`read_usage` reads one leniently (a server's own
``usage`` may carry more fields, e.g. ``prompt_tokens_details``; a ``total_tokens`` is not
trusted, it is recomputed) and :meth:`Usage.from_json` strictly (the gateway's processes
reading one another).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

METADATA_KEY = "hangup-usage"
"""gRPC trailing metadata of a call cancelled while it ran: its usage, as JSON."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call consumed: its prompts' and what the engine generated for it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_json(cls, value: object) -> Usage:
        """Read :meth:`to_json`'s shape strictly. Raises ``ValueError`` naming what is wrong."""
        if not isinstance(value, dict):
            raise ValueError("'usage' must be a JSON object")
        found = read_usage(value)
        if found is None:
            raise ValueError("'usage' needs prompt_tokens and completion_tokens, integers >= 0")
        return found


def metadata(usage: Usage) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that says ``usage`` (:data:`METADATA_KEY`)."""
    return ((METADATA_KEY, json.dumps(usage.to_json())),)


def usage_in_metadata(entries: Sequence[tuple[str, Any]]) -> Usage | None:
    """The usage a call's metadata names under :data:`METADATA_KEY`, or None."""
    for key, value in entries:
        if key == METADATA_KEY and isinstance(value, str):
            try:
                return read_usage(json.loads(value))
            except (ValueError, RecursionError):
                return None
    return None


def read_usage(value: Any) -> Usage | None:
    """The usage ``value`` names (an OpenAI ``usage`` object), or None when it is not one: not an
    object, or ``prompt_tokens``/``completion_tokens`` missing, not integers, or negative.
    Other fields are ignored."""
    if not isinstance(value, dict):
        return None
    prompt, completion = _count(value.get("prompt_tokens")), _count(value.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    return Usage(prompt, completion)


def _count(value: object) -> int | None:
    """A token count: an integer >= 0 (not a bool); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
