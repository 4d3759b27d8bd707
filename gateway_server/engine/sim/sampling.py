"""The simulated engine's language model and sampler: small, fixed, and honest.

The vocabulary is ``VOCAB`` (token id ``i`` is ``VOCAB[i]``). The "model" gives the next word's
logits from the previous word alone: the word ``k`` places after the previous one (cyclically,
stride ``_STRIDE``) has logit ``-ln(k + 1)``, a Zipf law. Sampling applies what vLLM applies, in
its order: logit bias, temperature (0 is greedy), then top-k, top-p and min-p truncation; the
seeded PRNG draws from what is left. Log-probabilities are the model's raw ones (vLLM's default
``raw_logprobs``: before bias, temperature and truncation), computed only when asked for.

A request's distributions depend only on its knobs, so they are built once per set of knobs
(cached) and a token costs one PRNG draw and a bisection. The knobs a client sizes,
``logit_bias`` and ``stop_token_ids``, are read once per request into what the vocabulary
holds (:class:`Prepared`): a pair or an id per word at most, however many the request named.
So a cache entry is at most ``len(VOCAB)`` biases and their tables (about 27 KiB), whatever the
requests, and no token's work depends on a field's size.
"""

from __future__ import annotations

import bisect
import math
import random
from functools import lru_cache

from gateway_server.engine.base import SamplingParams, TokenLogprob

VOCAB = tuple(
    "the quick brown fox jumps over a lazy dog while engines hum and tokens flow through "
    "queues of patient requests waiting for their turn on busy accelerators".split()
)
_STRIDE = 7
_EPS = 1e-5
"""Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``)."""
MAX_LOGPROBS = 20
"""Most top candidates a request may ask for (vLLM's default ``max_logprobs``)."""
MAX_BIAS = 100.0
"""vLLM clamps each logit bias to this, either way (``SamplingParams``, as OpenAI's API)."""


def _logits(prev: int) -> list[float]:
    size = len(VOCAB)
    return [-math.log(((i - prev * _STRIDE) % size) + 1) for i in range(size)]


def _log_softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - norm for x in logits]


_RAW = tuple(tuple(_log_softmax(_logits(prev))) for prev in range(len(VOCAB)))
"""The model's log-probabilities: ``_RAW[prev][i]``."""


@lru_cache(maxsize=256)
def _tables(
    temperature: float, top_k: int, top_p: float, min_p: float, bias: tuple[tuple[int, float], ...]
) -> tuple[tuple[float, ...] | int, ...]:
    """Per previous word: the cumulative weights to draw from, or the greedy choice's id."""
    out: list[tuple[float, ...] | int] = []
    for prev in range(len(VOCAB)):
        logits = _logits(prev)
        for token, value in bias:
            logits[token] += value
        if temperature < _EPS:
            out.append(max(range(len(logits)), key=lambda i: (logits[i], -i)))
            continue
        probs = [math.exp(p) for p in _log_softmax([x / temperature for x in logits])]
        keep = _truncate(probs, top_k, top_p, min_p)
        weights = [p if i in keep else 0.0 for i, p in enumerate(probs)]
        cumulative, total = [], 0.0
        for w in weights:
            total += w
            cumulative.append(total)
        out.append(tuple(cumulative))
    return tuple(out)


def _truncate(probs: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if 0 < top_k < len(order):
        order = order[:top_k]
    kept, mass = [], 0.0
    for i in order:  # top-p: the smallest head whose mass reaches top_p
        kept.append(i)
        mass += probs[i]
        if mass >= top_p - 1e-12:
            break
    floor = min_p * probs[order[0]]
    return {i for i in kept if probs[i] >= floor}


def merged_bias(bias: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as vLLM applies it: one bias per token id (the last one given wins, as in
    the dict vLLM makes of them), each clamped to ``MAX_BIAS``, in token order."""
    merged = dict(bias)
    return tuple((t, min(MAX_BIAS, max(-MAX_BIAS, merged[t]))) for t in sorted(merged))


class Prepared:
    """A request's ``logit_bias`` merged and its ``stop_token_ids`` as a set, read once.

    The choices of one call (``n``) share these fields' tuples and arrive together, so the last
    ones read are kept by identity and reused: a field of a million entries costs one pass per
    call, not one per choice, and nothing per token. It holds one request's fields at most,
    until :meth:`forget` (the engine's next step).
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[object, object, tuple[tuple[int, float], ...], frozenset[int]] | None
        self._last = None

    def read(self, params: SamplingParams) -> tuple[tuple[tuple[int, float], ...], frozenset[int]]:
        """``(merged logit bias, stop token ids)`` of ``params``."""
        last = self._last
        if last is None or last[0] is not params.logit_bias or last[1] is not params.stop_token_ids:
            bias, stops = merged_bias(params.logit_bias), frozenset(params.stop_token_ids)
            last = self._last = (params.logit_bias, params.stop_token_ids, bias, stops)
        return last[2], last[3]

    def forget(self) -> None:
        self._last = None


class Sampler:
    """One request's next-token draws (see module doc); ``bias`` is its merged logit bias
    (:func:`merged_bias`)."""

    __slots__ = ("_prev", "_rng", "_tables", "_top")

    def __init__(
        self, params: SamplingParams, rng: random.Random, bias: tuple[tuple[int, float], ...]
    ) -> None:
        top_k = params.top_k if params.top_k > 0 else 0
        self._rng = rng
        self._tables = _tables(params.temperature, top_k, params.top_p, params.min_p, bias)
        self._prev = rng.randrange(len(VOCAB))
        self._top = params.logprobs

    def next(self) -> int:
        table = self._tables[self._prev]
        if isinstance(table, int):
            token = table
        else:
            token = bisect.bisect_right(table, self._rng.random() * table[-1])
            token = min(token, len(VOCAB) - 1)
        self._prev = token
        return token

    def logprob(self, prev: int, token: int, first: bool) -> TokenLogprob:
        """The raw log-probability of ``token`` after ``prev``, with the top candidates in
        vLLM's order (the chosen token first, then the most likely)."""
        raw = _RAW[prev]
        ranked = sorted(range(len(raw)), key=lambda i: -raw[i])[: self._top or 0]
        candidates = dict.fromkeys([token, *ranked])
        top = tuple((piece(i, first), raw[i]) for i in candidates)
        return TokenLogprob(piece(token, first), raw[token], top)

    @property
    def prev(self) -> int:
        return self._prev


def piece(token: int, first: bool) -> str:
    """The text a token adds: words are separated by a space."""
    return VOCAB[token] if first else " " + VOCAB[token]
