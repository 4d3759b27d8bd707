"""The Responses API's events without I/O: a text delta's fast encoding is ``json.dumps``' bytes,
whatever the text."""

from __future__ import annotations

import json

import pytest

from gateway_server import sse
from gateway_server.openai.responses.objects import Answer, Events, encode


@pytest.mark.parametrize(
    "text", ["", " word", 'é"\n\\ 日本', "\u2028x", "\x00\x1f", "🙂", "</script>"]
)
def test_a_delta_is_encoded_as_json_dumps_would(text: str) -> None:
    events = Events(Answer("resp_" + "a" * 32, "m", {}))
    events.created()
    delta = events.delta(text)
    assert delta["sequence_number"] == 1
    assert encode(delta) == sse.encode(json.dumps(delta), event="response.output_text.delta")
    assert json.loads(encode(delta).split(b"data: ", 1)[1])["delta"] == text
