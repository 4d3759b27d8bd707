"""A stream's own books of its tokens, added to the shared metrics a few tokens at a time.

Every streamed token used to increment ``hangup_gateway_generated_tokens_total`` and observe
``hangup_gateway_inter_token_latency_seconds`` at once. With ``--api-processes`` those values
live in prometheus_client's multiprocess files, where one update takes a lock, a ``getpid`` and
an mmap write (``inc`` and ``observe`` 3.1 µs together per token, against 1.25 in memory). A
:class:`TokenBooks` keeps the count, the histogram's bucket counts and its sum in plain
attributes and adds them to the shared series every :data:`FLUSH_TOKENS` tokens or
:data:`FLUSH_SECONDS`, whichever comes first (at a pace over 16 tokens/s, every 16 tokens), and
when the stream ends (``flush``, called however it ends), so totals are exact once a request is
over; while it runs, ``/metrics`` may miss up to 15 of its tokens or a second of them.

The histogram is updated through prometheus_client's ``Histogram`` internals (``_sum``,
``_buckets``, ``_upper_bounds``: one ``inc`` per bucket that changed instead of two per
observation); ``tests/pure/test_token_books.py`` checks the exposition against plain
``observe`` calls, so a change in those internals fails there.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Counter, Histogram

FLUSH_TOKENS = 16
"""Tokens a stream counts in its own books before adding them to the shared series."""
FLUSH_SECONDS = 1.0
"""And the longest it keeps them (checked when a chunk arrives). Not shorter: at a real decode
pace (20-100 tokens/s per stream) 50 ms would flush every 1-5 tokens and keep most of the cost
(measured: a 50 ms bound at ~43 tokens/s per stream put ``flush`` in 6 % of an API process's
samples)."""


class TokenBooks:
    """One engine request's pending tokens and inter-token observations.

    ``tokens`` and ``inter_token`` are bound series (``labels(...)`` already applied). Not
    thread-safe: one stream's task owns it. ``flush`` is idempotent.
    """

    __slots__ = (
        "_bounds",
        "_buckets",
        "_histogram",
        "_observed",
        "_pending",
        "_since",
        "_sum",
        "_tokens",
    )

    def __init__(self, tokens: Counter, inter_token: Histogram, now: float) -> None:
        self._tokens = tokens
        self._histogram = inter_token
        self._bounds: list[float] = list(inter_token._upper_bounds)
        self._pending = 0
        self._observed = 0
        self._buckets = [0] * len(self._bounds)
        self._sum = 0.0
        self._since = now

    def add(self, n: int, now: float, gap: float | None) -> None:
        """Count ``n`` tokens that arrived at ``now`` (``time.perf_counter()``), and observe
        ``gap`` seconds per token when it is not the first chunk (``None``)."""
        self._pending += n
        if gap is not None:
            self._buckets[bisect_left(self._bounds, gap)] += 1
            self._sum += gap
            self._observed += 1
        if self._pending >= FLUSH_TOKENS or now - self._since >= FLUSH_SECONDS:
            self.flush(now)

    def flush(self, now: float) -> None:
        """Add what is pending to the shared series."""
        self._since = now
        if self._pending:
            self._tokens.inc(self._pending)
            self._pending = 0
        if self._observed:
            histogram = self._histogram
            histogram._sum.inc(self._sum)
            for i, count in enumerate(self._buckets):
                if count:
                    histogram._buckets[i].inc(count)
                    self._buckets[i] = 0
            self._sum = 0.0
            self._observed = 0
