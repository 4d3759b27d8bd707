"""The sibling channel's framing with no I/O (``hangup_contract/runtime/sibling_lines.py``): a
message as one line and back, each bound where it says, lines cut the same at every byte
boundary, and a line past its bound skipped to its end."""

from __future__ import annotations

import pytest

from hangup_contract.runtime.sibling_lines import (
    Lines,
    Malformed,
    MessageTooLarge,
    decode,
    encode,
    integer,
    sequence,
    text,
)


def test_a_message_is_one_line_and_reads_back() -> None:
    message = {"n": 3, "op": "held", "id": "é\u2028\n", "deep": [{"a": None}]}
    line = encode(message, 1000)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line[:-1]) == message


def test_a_line_is_written_up_to_its_bound_and_never_past_it() -> None:
    line = encode({"id": "x" * 100}, 1000)
    assert len(encode({"id": "x" * 100}, len(line) - 1)) == len(line)  # the newline not counted
    with pytest.raises(MessageTooLarge, match="held message"):
        encode({"op": "held", "id": "x" * 100}, 100)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"[]",
        b"1",
        b'"a"',
        b"null",
        b"{",
        b"\xff",
        b"[" * 100_000,
        b'{"a": 1' + b"0" * 5000 + b"}",
    ],
)
def test_what_is_no_message_is_malformed(line: bytes) -> None:
    with pytest.raises(Malformed):
        decode(line)


def test_a_sequence_number_is_an_integer_of_zero_or_more_or_absent() -> None:
    assert sequence({"n": 0}) == 0 and sequence({"op": "x"}) is None
    for bad in ("1", True, -1, 1.0, [1]):
        with pytest.raises(Malformed):
            sequence({"n": bad})


def test_fields_are_read_as_their_kind() -> None:
    message = {"id": "a", "owner": 2, "flag": True}
    assert text(message, "id") == "a" and integer(message, "owner") == 2
    for read, name in ((text, "owner"), (text, "missing"), (integer, "id"), (integer, "flag")):
        with pytest.raises(Malformed):
            read(message, name)


STREAM = b'{"n":1}\n\n{"n":2,"id":"abc"}\n' + b"x" * 40 + b"\n" + b'{"n":3}\n'
EXPECTED = [b'{"n":1}', b"", b'{"n":2,"id":"abc"}', None, b'{"n":3}']


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_lines_are_the_same_cut_at_every_byte(cut: int) -> None:
    lines = Lines(20)
    assert lines.feed(STREAM[:cut]) + lines.feed(STREAM[cut:]) == EXPECTED


def test_lines_fed_a_byte_at_a_time() -> None:
    lines = Lines(20)
    assert [line for byte in STREAM for line in lines.feed(bytes([byte]))] == EXPECTED


def test_a_line_past_its_bound_is_told_at_once_and_never_held() -> None:
    lines = Lines(20)
    assert lines.feed(b"y" * 21) == [None]  # past it before its newline came
    for _ in range(100):
        assert lines.feed(b"y" * 1000) == []  # the rest of it: dropped as it comes
    assert lines.feed(b'y\n{"n":1}\n') == [b'{"n":1}']
    assert lines.feed(b"z" * 20 + b"\n") == [b"z" * 20]  # exactly the bound: a line
