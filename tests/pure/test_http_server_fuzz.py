"""The proxy's HTTP/1.1 server under a byte-level fuzz (``bench/harness/server_fuzz.py``): requests
built from the parts a client controls, then mutated byte by byte, cut into reads anywhere. A
bounded number of examples here, derandomized (the same inputs every run); the long run with
fresh seeds is ``python -m bench.robustness.framing --fuzz-examples N``."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.server_fuzz import (
    check_built,
    check_mutated,
    messages,
    mutated,
    serve,
    violations,
)

FUZZ = settings(
    max_examples=300, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip


@FUZZ
@given(messages, st.lists(st.integers(0, 2000), max_size=6))
def test_built_requests_carry_nothing_from_a_body_or_trailer_and_read_the_same_however_cut(
    parts: list[bytes], at: list[int]
) -> None:
    check_built(parts, at)


@FUZZ
@given(st.data())
def test_mutated_requests_break_no_rule_and_read_the_same_however_cut(data: st.DataObject) -> None:
    raw = data.draw(mutated(b"".join(data.draw(messages))))
    check_mutated(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))


def test_the_fuzz_sees_a_trailer_field_in_a_head() -> None:
    """The rule is not vacuous: a request whose trailer field ends up in its head (what
    27a1715 did) breaks it."""
    data = (b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\nX-Trailer-Auth: 1\r\n\r\n")  # fmt: skip
    outcome = serve([data])
    outcome.handed[0].headers.append(("X-Trailer-Auth", "1"))
    assert violations(data, outcome, built=[data]) == ["a trailer or body field in a head: "
                                                     "'X-Trailer-Auth': '1'"]  # fmt: skip
