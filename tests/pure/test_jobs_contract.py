"""The jobs contract (``hangup_contract/jobs.py``) and the sidecar's memory of groups
(``proxy/calls/groups.py``), without I/O: the batch body, the routes a sidecar reads, the answer
shape both sides write, an answer's own id, and the bounds on groups held and buried."""

from __future__ import annotations

import json

import pytest

from hangup_contract import jobs
from hangup_contract.cancel_labels import Reason
from proxy.calls.groups import GroupBounds, HeldGroups, checked_group
from proxy.calls.siblings import ANSWER_BYTES, BOUNDS, fitted, unfitted
from proxy.errors import BadGroup, CancelledById, TooManyGroupCalls


def test_a_batch_names_each_id_once_in_order_with_its_reason() -> None:
    body = json.dumps({"request_ids": ["b", "a", "b", "c:x y"], "reason": "shutdown"}).encode()
    assert jobs.parse_batch(body, 4) == jobs.Batch(("b", "a", "c:x y"), Reason.SHUTDOWN)
    assert jobs.parse_batch(b'{"request_ids": []}', 1) == jobs.Batch((), Reason.EXPLICIT)


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"", "not valid JSON"), (b"[]", "a JSON object"), (b"{}", "must be a list"),
     (b'{"request_ids": "a"}', "must be a list"), (b'{"request_ids": ["a", 3]}', r"\[1\]"),
     (b'{"request_ids": ["a b"]}', r"\[0\]' must be"), (b'{"request_ids": ["a", "b", "c"]}',
     "names 3 ids: at most 2"), (b'{"request_ids": [], "reason": "bored"}', "unknown reason"),
     (b'{"request_ids": [], "reason": 1}', "must be a string")],
)  # fmt: skip
def test_a_bad_batch_names_its_problem(body: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jobs.parse_batch(body, 2)


@pytest.mark.parametrize(
    ("method", "target", "route"),
    [("POST", "/v2/groups/job-1/cancel", jobs.Route("group", group="job-1")),
     ("POST", "/v2/groups/a%2Fb/cancel?x=1", jobs.Route("group", group="a/b")),
     ("POST", "/v2/requests/cancel", jobs.Route("batch")),
     ("POST", "/v1/requests/cancel", jobs.Route("batch", vllm=True)),
     ("POST", "/v1/requests/cmpl-1/cancel", jobs.Route("single", request_id="cmpl-1", vllm=True)),
     ("DELETE", "/v1/requests/r%3A1", jobs.Route("single", request_id="r:1", vllm=True)),
     ("GET", "/v2/sidecar/requests?group=g", jobs.Route("held")),
     ("GET", "/v2/requests", None), ("POST", "/v2/requests/x/cancel", None),
     ("POST", "/v1/requests/x", None), ("DELETE", "/v1/requests/x/cancel", None),
     ("POST", "/v2/groups//cancel", None), ("PUT", "/v2/groups/g/cancel", None),
     ("POST", "/v1/chat/completions", None)],
)  # fmt: skip
def test_the_routes_a_sidecar_answers(method: str, target: str, route: jobs.Route | None) -> None:
    assert jobs.route_of(method, target) == route


def test_a_job_answer_names_what_happened_to_each_id() -> None:
    entries = [{"request_id": "a", "state": "cancelled", "phase": "decode"},
               {"request_id": "b", "state": "finished"}, jobs.not_found("c")]  # fmt: skip
    answer = jobs.job_answer(entries, "g")
    assert answer == {"status": "cancelled", "group": "g", "cancelled_request_ids": ["a"],
                      "results": entries}  # fmt: skip
    assert jobs.answer_entries(json.dumps(answer)) == entries
    for bad in ("{}", '{"results": [{"request_id": 1, "state": "x"}]}', "[", '{"results": 1}'):
        with pytest.raises(ValueError):
            jobs.answer_entries(bad)


def test_an_answers_own_id_names_its_call() -> None:
    assert jobs.call_id_of_answer_id("chatcmpl-abc") == "abc"
    assert jobs.call_id_of_answer_id("cmpl-a:b") == "a:b"
    assert jobs.call_id_of_answer_id("cmpl-") is None
    assert jobs.call_id_of_answer_id("resp_abc") is None
    assert jobs.call_id_of_answer_id("chatcmpl-" + "x" * 129) is None


def test_a_group_keeps_the_id_rule_and_header_and_body_agree() -> None:
    assert jobs.check_group("job-1") == "job-1" and jobs.check_group(None) is None
    assert jobs.body_group({"metadata": {"hangup_group": "g"}}) == "g"
    assert jobs.body_group({"metadata": "x"}) is None and jobs.body_group({}) is None
    assert jobs.one_group("g", "g") == "g" and jobs.one_group(None, "g") == "g"
    for bad in (lambda: jobs.check_group("a b"), lambda: jobs.one_group("a", "b"),
                lambda: jobs.body_group({"metadata": {"hangup_group": 7}})):  # fmt: skip
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(BadGroup):
        checked_group("x" * 129)


def test_held_groups_are_bounded_and_a_buried_group_refuses_its_calls_until_the_ttl() -> None:
    groups = HeldGroups[str](GroupBounds(groups=2, calls=2, buried=3, buried_bytes=10_000, ttl=5))
    groups.join("a", "one", 0)
    groups.join("a", "two", 0)
    with pytest.raises(TooManyGroupCalls, match="--max-group-calls"):
        groups.join("a", "three", 0)
    groups.join("b", "one", 0)
    with pytest.raises(TooManyGroupCalls, match="--max-groups"):
        groups.join("c", "one", 0)
    assert groups.calls("a") == ["one", "two"]
    groups.leave("a", "one")
    groups.leave("a", "two")
    groups.join("c", "one", 0)  # "a" is gone: room for another
    groups.bury("a", 0)
    with pytest.raises(CancelledById):
        groups.join("a", "four", 4.9)
    groups.expire(5.0)
    groups.leave("b", "one")
    groups.join("a", "four", 5.0)  # the ttl passed
    for name in ("w", "x", "y", "z"):
        groups.bury(name, 6)
    assert groups.sizes()[1:] == (3, 3 * (1 + 200))  # the oldest dropped past the count


def test_a_workers_answer_holds_what_fits_in_a_line_and_counts_the_rest() -> None:
    entries: list[dict[str, object]] = [
        {"request_id": f"{n:0128d}", "state": "cancelled"} for n in range(2000)
    ]
    answer = fitted(entries)
    assert len(json.dumps({**answer, "n": 1})) < ANSWER_BYTES + 100 <= BOUNDS.answer
    kept, more = unfitted(answer)
    assert kept == entries[: len(kept)] and len(kept) + more == 2000 and more > 0
    assert unfitted(None) == ([], 0) and unfitted({"state": "held"}) == ([], 0)
