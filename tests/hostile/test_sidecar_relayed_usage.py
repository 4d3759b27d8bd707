"""Hostile input for the sidecar's one read of an answer it relayed: the server's own usage at
the end of a call that ended cancelled (``proxy.http.relayed.usage_in``). A server behind may
send anything; fed any tail up to what the sink keeps (``TAIL_BYTES``), the read answers a
``Usage`` or None, never raises, within the hostile tier's CPU budget
(``bench.harness.hostile.Budget``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import Budget, timed
from hangup_contract.usage import Usage
from proxy.http.relayed import TAIL_BYTES, usage_in

BUDGET = Budget()
EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = TAIL_BYTES

_pieces = st.sampled_from([
    b"data: ", b"data:", b"\n\n", b"\n", b'"usage"', b'"parameters"', b"{", b"[", b"}", b'"',
    b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}', b"\\u0000", b"9", b"\xff",
])  # fmt: skip
_runs = st.lists(st.tuples(_pieces, st.integers(1, 4096)), max_size=12).map(
    lambda runs: b"".join(piece * n for piece, n in runs)[:LIMIT]
)


def _worst() -> dict[str, bytes]:
    """Tails at the limit that a naive reader spends the most on."""
    usage_event = b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": "x"}}\n\n'
    return {
        "many events naming usage, none valid": (usage_event * LIMIT)[:LIMIT],
        "data markers only": (b"data:" * LIMIT)[:LIMIT],
        "one event nested deep": (b'data: {"usage": ' + b"[" * LIMIT)[:LIMIT],
        "one long line naming usage": (b'data: {"usage": "' + b"a" * LIMIT)[:LIMIT],
        "a body nested deep": (b'{"usage": ' + b'{"a":' * LIMIT)[:LIMIT],
        "digits": (b'data: {"usage": {"prompt_tokens": ' + b"9" * LIMIT)[:LIMIT],
    }


def _check(tail: bytes) -> None:
    outcome = timed(usage_in, tail)
    assert outcome.error is None, outcome.error
    assert outcome.result is None or isinstance(outcome.result, Usage)
    BUDGET.check("a relayed answer's tail", len(tail), outcome.spent)


@EXAMPLES
@given(tail=st.one_of(st.binary(max_size=LIMIT), _runs))
def test_any_tail_is_read_as_a_usage_or_nothing_within_budget(tail: bytes) -> None:
    _check(tail)


@pytest.mark.parametrize("what", list(_worst()))
def test_a_tail_at_its_limit(what: str) -> None:
    _check(_worst()[what])


def test_a_tail_over_the_limit_is_read_only_at_its_end() -> None:
    usage = b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\n'
    outcome = timed(usage_in, b"x" * (16 * LIMIT) + usage)
    assert outcome.result == Usage(1, 2)
    BUDGET.check("a long tail", LIMIT, outcome.spent)
    assert json.dumps(outcome.result.to_json())
