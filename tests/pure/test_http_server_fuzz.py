"""The proxy's HTTP/1.1 server side (``proxy.http.core``, with no I/O) under a byte-level fuzz
(``bench/harness/server_fuzz.py``): requests built from the parts a client controls, then
mutated byte by byte, cut into reads anywhere. A bounded number of examples here, derandomized
(the same inputs every run); the long run with fresh seeds is
``python -m bench.robustness.framing --fuzz-examples N``. The last test runs the fuzz against a
mutant of the core's header rule (trailer fields joined to the head, as 27a1715 did) and shows it
caught."""

from __future__ import annotations

import inspect
import textwrap

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import proxy.http.core
from bench.harness.server_fuzz import (
    check_built,
    check_mutated,
    messages,
    mutated,
    serve,
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


# The mutation (of the method's source, dedented): a trailer field is counted, then falls
# through to the head's fields, as on 27a1715.
_RULE = "Envoy does by default.\n        return\n"
_MUTANT = "Envoy does by default.\n        pass\n"


def _mutant_on_header() -> object:
    """``HttpCore.on_header`` compiled from its own source with the mutation applied, in its
    module's namespace."""
    source = textwrap.dedent(inspect.getsource(proxy.http.core.HttpCore.on_header))
    assert source.count(_RULE) == 1, "the trailer rule changed shape: update the mutation"
    namespace: dict[str, object] = {}
    exec(source.replace(_RULE, _MUTANT), vars(proxy.http.core), namespace)
    return namespace["on_header"]


def test_the_fuzz_catches_a_header_rule_that_joins_trailers_to_the_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule is not vacuous: with the core's header rule mutated so that trailer fields join
    the head's (what 27a1715 did), the same fuzz, on the same examples, fails and says why; the
    request it found reaches the handler with a trailer field in its head."""
    monkeypatch.setattr(proxy.http.core.HttpCore, "on_header", _mutant_on_header())
    fuzz = settings(FUZZ, phases=[Phase.generate])  # the first failure, unshrunk
    with pytest.raises(AssertionError) as caught:
        given(messages, st.lists(st.integers(0, 2000), max_size=6))(fuzz(check_built))()
    data, found = caught.value.args[0]
    assert any(f.startswith("a trailer or body field in a head: ") for f in found), found
    handed = serve([data]).handed
    assert any(n.lower().startswith("x-trailer-") for h in handed for n, _ in h.headers)
