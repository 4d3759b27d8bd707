"""The Triton bridge's reading of a body into a KServe request (``proxy.triton``): ``/infer``'s
JSON and binary tensors, and ``generate``'s JSON (``generate_stream`` reads it the same way), fed
hostile input up to ``--max-body-size`` (``bench/harness/hostile_parsers.py``): data of tiny
arrays, ragged or nested thousands deep, shapes of millions of dimensions, floats, strings, big
numbers, many inputs, outputs and parameters, binary framing that lies. Each is a request or a
400 (``GenerateError``), within the budget docs/security.md states for the bridge (150 ms per MiB
+ 10 ms: a JSON array or number is a Python object each, and a body msgspec refuses is read again
by json). The long run is
``python -m bench.robustness.hostile``."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from bench.harness.hostile import Budget, timed
from bench.harness.hostile_parsers import BRIDGE_BUDGET, INFER_MODEL, PARSERS, PHASES
from proxy.triton.codec import GenerateError
from proxy.triton.infer import infer_request

HOSTILE = settings(
    max_examples=40, derandomize=True, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), phases=PHASES,
)  # fmt: skip


@pytest.mark.parametrize("name", ["triton-infer", "triton-generate"])
def test_the_costliest_inputs_known_keep_the_budget(name: str) -> None:
    parser = PARSERS[name]
    for case in parser.worst():
        parser.check(case)


@HOSTILE
@given(PARSERS["triton-infer"].inputs)
def test_hostile_infer_bodies_keep_the_budget_and_get_a_400(case: tuple[bytes, str | None]) -> None:
    PARSERS["triton-infer"].check(case)


@HOSTILE
@given(PARSERS["triton-generate"].inputs)
def test_hostile_generate_bodies_keep_the_budget_and_get_a_400(
    case: tuple[bytes, str | None],
) -> None:
    PARSERS["triton-generate"].check(case)


def test_a_shape_of_many_small_dimensions_is_refused_at_once() -> None:
    """Finding 3 of issue 59: a 625 KiB body whose shape is 2s took 5-9 s to be refused (the
    dimensions multiplied into a number of 100,000 digits first), holding the event loop; its
    count is refused as it passes what the data holds now, in the default budget."""
    dimensions = 625 * 1024 // 2
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1, 2],
                                   "shape": [2] * dimensions}]}).encode()  # fmt: skip
    outcome = timed(infer_request, INFER_MODEL, body, None)
    assert isinstance(outcome.error, GenerateError) and outcome.error.status == 400
    Budget().check("a shape of 2s", len(body), outcome.spent)
    assert BRIDGE_BUDGET.per_mib > Budget().per_mib  # the bridge's own is the larger
