"""A stream's token books: what reaches the shared counter and histogram, in memory and in
prometheus_client's multiprocess files, equals what plain per-token updates would have made,
exactly once the books are flushed and never more than a batch behind before."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from gateway_server.metrics.gateway import LATENCY_BUCKETS
from gateway_server.metrics.token_books import FLUSH_SECONDS, FLUSH_TOKENS, TokenBooks

# (tokens in the chunk, seconds since the previous chunk): gaps from 0 to past the last bucket,
# bucket bounds themselves included (a value on a bound belongs to that bucket).
GAPS = st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0.0, 100.0))
CHUNKS = st.lists(st.tuples(st.integers(1, 5), GAPS), min_size=1, max_size=80)


def _series(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    tokens = Counter("t_tokens", "tokens", ["model"], registry=registry)
    gaps = Histogram("t_gap_seconds", "gaps", ["model"], buckets=LATENCY_BUCKETS, registry=registry)
    return tokens.labels("m"), gaps.labels("m")


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """Every sample but ``_created``, by (name, le)."""
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _stream(
    books: TokenBooks, plain: tuple[Counter, Histogram], chunks: list[tuple[int, float]]
) -> None:
    """Feed ``chunks`` to ``books`` and, per token as before, to ``plain``; the first chunk has
    no gap. Checks the lag after every chunk."""
    tokens, gaps = plain
    now, streamed = 0.0, 0
    shared = books._tokens  # the series ``books`` adds to (a test may read it)
    for i, (n, gap) in enumerate(chunks):
        now += min(gap, FLUSH_SECONDS / 2)  # the clock: flushes by time as well as by count
        books.add(n, now, None if i == 0 else gap)
        tokens.inc(n)
        if i:
            gaps.observe(gap)
        streamed += n
        assert streamed - FLUSH_TOKENS < shared._value.get() <= streamed


def _assert_same(
    batched: dict[tuple[str, str], float], plain: dict[tuple[str, str], float]
) -> None:
    assert batched.keys() == plain.keys()
    for key, value in plain.items():
        assert batched[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@settings(max_examples=200, deadline=None)
@given(CHUNKS)
def test_flushed_books_equal_per_token_updates_in_memory(chunks: list[tuple[int, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    books = TokenBooks(*_series(ours), now=0.0)
    _stream(books, _series(theirs), chunks)
    books.flush(1.0)
    books.flush(2.0)  # idempotent: nothing is added twice
    _assert_same(_samples(ours), _samples(theirs))


def test_flushed_books_equal_per_token_updates_in_multiprocess_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--api-processes`` the series keep their values in mmap files, one per process."""
    chunks = [(1, 0.0), *((1 + i % 3, LATENCY_BUCKETS[i % 18] * (1 + i % 2)) for i in range(99))]
    plain_registry = CollectorRegistry()
    plain = _series(plain_registry)  # in memory
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: 4242))
    books = TokenBooks(*_series(CollectorRegistry()), now=0.0)  # in tmp_path's files
    _stream(books, plain, chunks)
    books.flush(10.0)
    _assert_same(_read_files(tmp_path), _samples(plain_registry))


def _read_files(folder: Path) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    return _samples(registry)
