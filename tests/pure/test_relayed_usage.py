"""The server's own usage read from the end of a relayed answer (``proxy.http.relayed``), and
the usage shape both sides share (``hangup_contract.usage``)."""

from __future__ import annotations

import json

import pytest

from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import CancelState, Phase
from hangup_contract.usage import Usage, metadata, read_usage, usage_in_metadata
from proxy.http.relayed import TAIL_BYTES, usage_in

USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def event(body: object) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def test_the_last_event_that_names_a_usage_is_read() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "text": "hi"}]}
    tail = (
        event(chunk | {"usage": {"prompt_tokens": 12, "completion_tokens": 4}})
        + event(chunk | {"usage": USAGE})  # vllm serve's continuous_usage_stats
        + event(chunk)
    )
    assert usage_in(tail) == Usage(12, 5)


def test_hangups_gateway_end_of_a_cancelled_stream_is_read() -> None:
    error = {"message": "request cancelled (explicit)", "type": "cancelled", "code": 499}
    openai = event({"choices": [], "usage": USAGE}) + event({"error": error, "usage": USAGE})
    assert usage_in(openai) == Usage(12, 5)
    kserve = event({"error": "request cancelled (explicit)", "parameters": USAGE})
    assert usage_in(kserve) == Usage(12, 5)


def test_a_whole_json_body_is_read_only_when_the_tail_holds_all_of_it() -> None:
    body = json.dumps({"error": {"message": "cancelled"}, "usage": USAGE}).encode()
    assert usage_in(body) == Usage(12, 5)
    assert usage_in(body[5:]) is None  # its start was not kept


@pytest.mark.parametrize(
    "tail",
    [
        b"",
        event({"choices": [{"text": "usage"}]}),
        event({"usage": None}),
        event({"usage": {"prompt_tokens": -1, "completion_tokens": 2}}),
        event({"usage": {"prompt_tokens": True, "completion_tokens": 2}}),
        b'data: {"usage": {"prompt_tokens": 3, "completion_tok',  # cut
        event({"usage": USAGE})[:-30] + b"data: [DONE]\n\n",
    ],
)
def test_nothing_is_made_up(tail: bytes) -> None:
    assert usage_in(tail) is None


def test_only_the_end_is_read() -> None:
    tail = event({"usage": USAGE}) + b"data: {}\n\n" * (TAIL_BYTES // 10)
    assert usage_in(tail) is None


def test_the_usage_shape_and_the_cancel_answer_carry_it_both_ways() -> None:
    usage = Usage(3, 4)
    assert usage.to_json() == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert Usage(1, 2) + Usage(3, 4) == Usage(4, 6)
    assert read_usage({"prompt_tokens": 3, "completion_tokens": 4, "extra": {}}) == usage
    assert read_usage({"prompt_tokens": 3}) is None
    answer = CancelAnswer("r", CancelState.CANCELLED, Phase.DECODE, 4, usage=usage)
    assert CancelAnswer.from_json(json.dumps(answer.to_json())) == answer
    with pytest.raises(ValueError, match="usage"):
        CancelAnswer.from_json(json.dumps(answer.to_json() | {"usage": {"prompt_tokens": 1}}))
    assert usage_in_metadata(metadata(usage)) == usage
    assert usage_in_metadata((("hangup-usage", "{"),)) is None
