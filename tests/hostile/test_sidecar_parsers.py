"""Hostile input for the two parsers of the sidecar's id paths (issue 59): the cancel API's body
(``hangup_contract.cancel.parse_request``, which the gateway's cancel API shares, and the id in
its path, ``cancelled_id``) and a line of the workers' sibling sockets
(``proxy.calls.siblings.read_message``). Fed anything up to their limits (64 KiB each), each
answers what it documents (a ``Reason``, the fields, or ``ValueError`` naming the problem:
never another exception, which would be a 500 or a dead connection handler) within the hostile
tier's CPU budget (``bench.harness.hostile.Budget``: 20 ms per MiB + 10 ms).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import Budget, timed
from hangup_contract.cancel import cancelled_id, parse_request
from hangup_contract.cancel_labels import Reason
from proxy.calls.siblings import LINE_LIMIT, read_message
from proxy.http.cancel_api import BODY_LIMIT

BUDGET = Budget()
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=64)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=16), inner),
    max_leaves=40,
)


def _hostile(limit: int, fields: list[str]) -> st.SearchStrategy[bytes]:
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


def _worst(limit: int) -> dict[str, bytes]:
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


def _check_cancel_body(body: bytes) -> None:
    outcome = timed(parse_request, body)
    assert outcome.error is None or isinstance(outcome.error, ValueError), outcome.error
    assert outcome.error is not None or isinstance(outcome.result, Reason)
    BUDGET.check("the cancel body", len(body), outcome.spent)


def _check_sibling_line(line: bytes) -> None:
    outcome = timed(read_message, line, "op", "id")
    assert outcome.error is None or isinstance(outcome.error, ValueError), outcome.error
    if outcome.error is None:
        assert all(v is None or isinstance(v, str) for v in outcome.result.values())
    BUDGET.check("a sibling line", len(line), outcome.spent)


@EXAMPLES
@given(body=_hostile(BODY_LIMIT, ["reason"]))
def test_the_cancel_body_parser_answers_a_reason_or_a_value_error_within_budget(
    body: bytes,
) -> None:
    _check_cancel_body(body)


@pytest.mark.parametrize("what", list(_worst(BODY_LIMIT)))
def test_the_cancel_body_parser_at_its_limit(what: str) -> None:
    _check_cancel_body(_worst(BODY_LIMIT)[what])


@EXAMPLES
@given(target=st.text(max_size=8190).map(lambda t: "/v2/requests/" + t + "/cancel"))
def test_the_cancelled_id_is_read_from_any_target_within_budget(target: str) -> None:
    outcome = timed(cancelled_id, target)
    assert outcome.error is None, outcome.error
    assert outcome.result is None or isinstance(outcome.result, str)
    BUDGET.check("a cancel path", len(target.encode("utf-8", "surrogatepass")), outcome.spent)


@EXAMPLES
@given(line=_hostile(LINE_LIMIT, ["op", "id", "state"]))
def test_a_sibling_line_is_read_or_refused_with_a_value_error_within_budget(
    line: bytes,
) -> None:
    _check_sibling_line(line)


@pytest.mark.parametrize("what", list(_worst(LINE_LIMIT)))
def test_a_sibling_line_at_its_limit(what: str) -> None:
    _check_sibling_line(_worst(LINE_LIMIT)[what])


def test_a_sibling_line_over_its_limit_is_refused_unread() -> None:
    outcome = timed(read_message, b"[" * (LINE_LIMIT + 1), "op")
    assert isinstance(outcome.error, ValueError) and "over" in str(outcome.error)
