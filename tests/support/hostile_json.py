"""Bytes a hostile peer sends a JSON reader, for the hostile tier's property tests
(``tests/hostile/``): noise, nesting, JSON of any shape, and the runs that readers find costly."""

from __future__ import annotations

import json

from hypothesis import strategies as st

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=64)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=16), inner),
    max_leaves=40,
)


def hostile_bytes(limit: int, fields: list[str]) -> st.SearchStrategy[bytes]:
    """Bytes a hostile client sends, up to ``limit``: noise, nesting, JSON of any shape, the
    expected fields with values of every type, and long runs of what parsers find costly."""
    field = st.sampled_from(fields)
    objects = st.dictionaries(st.one_of(field, st.text(max_size=8)), _json, max_size=6)
    runs = st.tuples(
        st.sampled_from([b"[", b'{"a":', b"\\u0000", b"\\\\", b"9", b" ", b"\xff", b'"']),
        st.integers(1, limit),
    ).map(lambda run: (run[0] * (run[1] // len(run[0]) or 1))[:limit])
    wrapped = st.tuples(field, runs).map(
        lambda parts: (b'{"' + parts[0].encode() + b'": "' + parts[1])[:limit]
    )
    return st.one_of(
        st.binary(max_size=limit),
        objects.map(lambda o: json.dumps(o).encode()[:limit]),
        _json.map(lambda v: json.dumps(v).encode()[:limit]),
        runs,
        wrapped,
    )


def worst_bytes(limit: int) -> dict[str, bytes]:
    """Inputs at the limit that a naive parser spends the most on."""
    return {
        "nesting": b"[" * limit,
        "nested objects": (b'{"a":' * limit)[:limit],
        "escapes": (b'{"reason": "' + b"\\u00e9" * limit)[: limit - 2] + b'"}',
        "digits": b"9" * limit,
        "an exponent": b"1e" + b"9" * (limit - 2),
        "whitespace": b" " * (limit - 2) + b"{}",
        "repeated keys": (b'{"reason": "explicit", ' * limit)[: limit - 1] + b"}",
        "not UTF-8": b'{"reason": "' + b"\xff" * (limit - 14) + b'"}',
        "lone surrogates": (b'{"id": "' + b"\\ud800" * limit)[: limit - 2] + b'"}',
    }
