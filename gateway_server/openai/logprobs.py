"""Log-probabilities in OpenAI's shapes, as ``vllm serve`` writes them.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}]}``, the top list being the engine's first ``top_logprobs`` candidates (vLLM's order:
the chosen token first, then the most likely). Completions: ``{"text_offset", "token_logprobs",
"tokens", "top_logprobs"}``, each top entry a ``{token: logprob}`` object of the first
``logprobs + 1`` candidates (OpenAI's rule), ``null`` for a token without one (an echoed
prompt's first token). Built only for requests that asked for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway_server.engine.base import TokenLogprob

NO_LOGPROB = -9999.0
"""What vllm serve writes for a token that has no log-probability in a chat answer."""


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat(tokens: Sequence[TokenLogprob], top: int) -> dict[str, Any]:
    content = []
    for t in tokens:
        content.append(
            {
                "token": t.token,
                "logprob": NO_LOGPROB if t.logprob is None else t.logprob,
                "bytes": _bytes(t.token),
                "top_logprobs": [
                    {"token": token, "logprob": lp, "bytes": _bytes(token)}
                    for token, lp in t.top[:top]
                ],
            }
        )
    return {"content": content}


def completion(tokens: Sequence[TokenLogprob], top: int, offset: int) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object for ``tokens`` whose text starts at ``offset``, and the offset
    after them (a stream continues from there)."""
    offsets, logprobs, texts, tops = [], [], [], []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
        logprobs.append(t.logprob)
        texts.append(t.token)
        tops.append(None if t.logprob is None else dict(t.top[: top + 1]))
    body = {
        "text_offset": offsets,
        "token_logprobs": logprobs,
        "tokens": texts,
        "top_logprobs": tops,
    }
    return body, offset
