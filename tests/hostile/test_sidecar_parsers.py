"""Hostile input for the parsers of the sidecar's id paths (issue 59): the cancel API's body
(``hangup_contract.cancel.parse_request``, which the gateway's cancel API shares, and the id in
its path, ``cancelled_id``). Fed anything up to their limits (64 KiB), each answers what it
documents (a ``Reason``, an id, or ``ValueError`` naming the problem: never another exception,
which would be a 500) within the hostile tier's CPU budget (``bench.harness.hostile.Budget``: 20
ms per MiB + 10 ms). A line of the workers' sibling sockets: ``test_sibling_channel.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import Budget, timed
from hangup_contract.cancel import cancelled_id, parse_request
from hangup_contract.cancel_labels import Reason
from proxy.http.cancel_api import BODY_LIMIT
from tests.support.hostile_json import hostile_bytes, worst_bytes

BUDGET = Budget()
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_cancel_body(body: bytes) -> None:
    outcome = timed(parse_request, body)
    assert outcome.error is None or isinstance(outcome.error, ValueError), outcome.error
    assert outcome.error is not None or isinstance(outcome.result, Reason)
    BUDGET.check("the cancel body", len(body), outcome.spent)


@EXAMPLES
@given(body=hostile_bytes(BODY_LIMIT, ["reason"]))
def test_the_cancel_body_parser_answers_a_reason_or_a_value_error_within_budget(
    body: bytes,
) -> None:
    _check_cancel_body(body)


@pytest.mark.parametrize("what", list(worst_bytes(BODY_LIMIT)))
def test_the_cancel_body_parser_at_its_limit(what: str) -> None:
    _check_cancel_body(worst_bytes(BODY_LIMIT)[what])


@EXAMPLES
@given(target=st.text(max_size=8190).map(lambda t: "/v2/requests/" + t + "/cancel"))
def test_the_cancelled_id_is_read_from_any_target_within_budget(target: str) -> None:
    outcome = timed(cancelled_id, target)
    assert outcome.error is None, outcome.error
    assert outcome.result is None or isinstance(outcome.result, str)
    BUDGET.check("a cancel path", len(target.encode("utf-8", "surrogatepass")), outcome.spent)
