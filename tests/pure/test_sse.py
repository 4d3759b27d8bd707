"""SSE framing, byte by byte."""

from __future__ import annotations

import pytest

from gateway_server.sse import Event, SSEDecoder, encode

STREAM = (
    b": a comment\n"
    b'data: {"a": 1}\n\n'
    b"event: update\r\nid: 7\r\ndata: line one\r\ndata:line two\r\n\r\n"
    b"data: caf\xc3\xa9\r\r"
    b"unknown: field\ndata: [DONE]\n\n"
)
EXPECTED = [
    Event('{"a": 1}'),
    Event("line one\nline two", "update", "7"),
    Event("café", None, "7"),
    Event("[DONE]", None, "7"),
]


def decode_in_pieces(stream: bytes, cuts: list[int]) -> list[Event]:
    decoder = SSEDecoder()
    events: list[Event] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        events.extend(decoder.feed(stream[start:cut]))
        start = cut
    return events


def test_decodes_whole_stream() -> None:
    assert decode_in_pieces(STREAM, []) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_decodes_stream_split_at_every_byte(cut: int) -> None:
    assert decode_in_pieces(STREAM, [cut]) == EXPECTED


def test_decodes_one_byte_at_a_time() -> None:
    assert decode_in_pieces(STREAM, list(range(1, len(STREAM)))) == EXPECTED


def test_event_without_blank_line_is_not_dispatched() -> None:
    assert SSEDecoder().feed(b"data: half") == []


def test_encode_round_trips_multiline_data() -> None:
    raw = encode("one\ntwo\r\nthree", event="e", id="1")
    assert raw == b"event: e\nid: 1\ndata: one\ndata: two\ndata: three\n\n"
    assert SSEDecoder().feed(raw) == [Event("one\ntwo\nthree", "e", "1")]


def test_encode_refuses_a_multiline_event_name() -> None:
    with pytest.raises(ValueError, match="one line"):
        encode("x", event="a\nb")
