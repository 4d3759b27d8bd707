"""A stream's outbox: responses in order, bounded in bytes, the putters waiting beyond; a
request's token responses merged while the writer is behind, never across requests and never the
empty final or an error (no I/O)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_server.grpc.outbox import MERGED_BYTES, Outbox
from gateway_server.grpc.responses import TextResponses
from gateway_server.grpc.stream import CANCEL_ID
from gateway_server.grpc.tensors import decode_bytes_tensor
from gateway_server.requests import FINAL_FLAG
from hangup_contract.protos import inference_pb2 as pb


async def test_responses_come_out_in_order_and_a_putter_waits_past_the_limit() -> None:
    box = Outbox(limit=10)
    await box.put(b"12345")
    await box.put(b"67890")  # now at the limit
    third = asyncio.create_task(box.put(b"abc"))
    await asyncio.sleep(0)
    assert not third.done() and box.held_bytes == 10
    assert await box.get() == b"12345"  # room again: the waiting putter goes on
    await asyncio.wait_for(third, 1)
    assert [await box.get(), await box.get()] == [b"67890", b"abc"]
    assert box.held_bytes == 0


async def test_one_response_larger_than_the_limit_still_passes() -> None:
    box = Outbox(limit=4)
    await asyncio.wait_for(box.put(b"x" * 100), 1)
    assert await box.get() == b"x" * 100


async def test_many_waiting_putters_hold_at_most_one_response_past_the_limit() -> None:
    box = Outbox(limit=10)
    await box.put(b"x" * 10)
    putters = [asyncio.create_task(box.put(bytes([i]) * 6)) for i in range(5)]
    await asyncio.sleep(0)
    taken = [await box.get()]
    for _ in range(5):
        await asyncio.sleep(0)
        assert box.held_bytes < 10 + 6
        taken.append(await box.get())
    await asyncio.gather(*putters)
    assert sorted(taken[1:]) == [bytes([i]) * 6 for i in range(5)]


async def test_close_ends_the_stream_after_what_is_held_and_frees_the_waiting() -> None:
    box = Outbox(limit=3)
    await box.put(b"abc")
    waiting = asyncio.create_task(box.put(b"late"))
    await asyncio.sleep(0)
    box.close()
    await asyncio.wait_for(waiting, 1)  # dropped: nobody will read it
    await box.put(b"later")  # likewise, at once
    assert await box.get() == b"abc"
    assert await box.get() is None and await box.get() is None


async def test_a_writer_waiting_for_a_response_wakes_for_one_or_for_the_end() -> None:
    box = Outbox(limit=10)
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    await box.put(b"hi")
    assert await asyncio.wait_for(getter, 1) == b"hi"
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.close()
    assert await asyncio.wait_for(getter, 1) is None


# -- a request's token responses merged while the writer is behind -------------------------------


def _request(request_id: str) -> TextResponses:
    return TextResponses("hangup-sim", "1", request_id, FINAL_FLAG, {CANCEL_ID: f"c:{request_id}"})


def _read(raw: bytes) -> tuple[str, str | None, bool, str]:
    """(request id, text or None, final flag, error message) of one written response."""
    message = pb.ModelStreamInferResponse.FromString(raw)
    response = message.infer_response
    text = None
    if response.outputs:
        (element,) = decode_bytes_tensor(response.raw_output_contents[0], "text_output")
        text = element.decode()
    final = response.parameters[FINAL_FLAG].bool_param
    return response.id, text, final, message.error_message


async def _drain(box: Outbox) -> list[tuple[str, str | None, bool, str]]:
    box.close()
    read = []
    while (raw := await box.get()) is not None:
        read.append(_read(raw))
    return read


async def test_a_writer_that_keeps_up_gets_one_response_per_token() -> None:
    box, a = Outbox(limit=1024), _request("a")
    tokens = [" one", " two", " three"]
    seen = []
    for index, token in enumerate(tokens):
        getter = asyncio.create_task(box.get())
        await asyncio.sleep(0)  # the writer waits for the next response, as one that keeps up
        await box.put_text(a, token.encode(), index == len(tokens) - 1)
        seen.append(_read(await getter))
    assert seen == [("a", " one", False, ""), ("a", " two", False, ""), ("a", " three", True, "")]


async def test_a_writer_behind_gets_a_requests_waiting_tokens_as_one_response_in_its_place() -> (
    None
):
    box, a, b = Outbox(limit=4096), _request("a"), _request("b")
    await box.put_text(a, b" a1", False)
    await box.put_text(b, b" b1", False)
    await box.put_text(a, b" a2", False)
    await box.put_text(b, "é€😀".encode(), False)
    await box.put_text(a, b" a3", True)  # a's last token: the merged response is final
    await box.put_text(b, b"", True)  # b's end, with no text
    assert await _drain(box) == [("a", " a1 a2 a3", True, ""), ("b", " b1é€😀", True, "")]
    assert box.held_bytes == 0


async def test_a_response_taken_by_the_writer_takes_no_more_tokens() -> None:
    box, a = Outbox(limit=4096), _request("a")
    await box.put_text(a, b" a1", False)
    await box.put_text(a, b" a2", False)
    assert _read(await box.get() or b"") == ("a", " a1 a2", False, "")
    await box.put_text(a, b" a3", False)
    await box.put_text(a, b" a4", True)
    assert await _drain(box) == [("a", " a3 a4", True, "")]


async def test_the_empty_final_and_an_error_stay_responses_of_their_own() -> None:
    box, a, b = Outbox(limit=4096), _request("a"), _request("b")
    await box.put_text(a, b" a1", False)
    await box.put_text(a, b" a2", False)
    await box.put_text(a, None, True)  # the empty final response asked for
    await box.put_text(b, b" b1", False)
    error = pb.ModelStreamInferResponse(error_message="CANCELLED: request cancelled (explicit)")
    error.infer_response.id = "b"
    await box.put(error.SerializeToString())
    await box.put_text(b, b" late", False)  # not merged back past b's error
    assert await _drain(box) == [
        ("a", " a1 a2", False, ""),
        ("a", None, True, ""),
        ("b", " b1", False, ""),
        ("b", None, False, "CANCELLED: request cancelled (explicit)"),
        ("b", " late", False, ""),
    ]


async def test_a_merged_response_takes_at_most_merged_bytes_of_text() -> None:
    box, a = Outbox(limit=16 * MERGED_BYTES), _request("a")
    token = b"x" * 1000
    for _ in range(3 * MERGED_BYTES // len(token)):
        await box.put_text(a, token, False)
    await box.put_text(a, b"x" * (2 * MERGED_BYTES), True)  # larger alone: a response of its own
    texts = [text or "" for _, text, _, _ in await _drain(box)]
    assert all(len(t) <= MERGED_BYTES for t in texts[:-1]) and len(texts[-1]) == 2 * MERGED_BYTES
    assert "".join(texts) == "x" * (3 * MERGED_BYTES // 1000 * 1000 + 2 * MERGED_BYTES)
    assert len(texts) == 5


async def test_merged_tokens_count_their_bytes_and_a_putter_still_waits_at_the_limit() -> None:
    a = _request("a")
    box = Outbox(limit=a.overhead + 40)
    await box.put_text(a, b"0123456789", False)
    assert box.held_bytes == a.overhead + 10
    for _ in range(3):
        await box.put_text(a, b"0123456789", False)  # merged: its text's bytes only
    assert box.held_bytes == a.overhead + 40  # at the limit
    waiting = asyncio.create_task(box.put_text(a, b"abc", True))
    await asyncio.sleep(0)
    assert not waiting.done()
    raw = await box.get()
    assert raw is not None and len(raw) <= a.overhead + 40 and box.held_bytes == 0
    await asyncio.wait_for(waiting, 1)
    assert await _drain(box) == [("a", "abc", True, "")]


_puts = st.lists(st.tuples(st.sampled_from("abc"), st.text(max_size=6), st.booleans()), max_size=40)


@settings(max_examples=200, deadline=None)
@given(script=_puts, reads=st.lists(st.booleans(), max_size=40), empty_final=st.booleans())
def test_whenever_the_writer_reads_every_token_arrives_once_in_order(
    script: list[tuple[str, str, bool]], reads: list[bool], empty_final: bool
) -> None:
    """Requests put tokens (each request's last flagged final, or followed by the empty final
    response) while the writer reads at any moments: per request the texts read join to the
    tokens put, in order; the final flag only on the last response, and on an empty one when
    asked for; never more responses than puts, and one per put when the writer read each."""

    async def run() -> None:
        box = Outbox(limit=1 << 20)
        requests = {name: _request(name) for name in "abc"}
        put: dict[str, list[str]] = {name: [] for name in "abc"}
        read: list[tuple[str, str | None, bool, str]] = []
        tokens = [(name, text) for name, text, _ in script]
        last = {name: i for i, (name, _) in enumerate(tokens)}
        for index, (name, text) in enumerate(tokens):
            final = last[name] == index and not empty_final
            await box.put_text(requests[name], text.encode(), final)
            put[name].append(text)
            if last[name] == index and empty_final:
                await box.put_text(requests[name], None, True)
            if index < len(reads) and reads[index]:
                while box.held_bytes:
                    read.append(_read(await box.get() or b""))
        read += await _drain(box)
        for name in "abc":
            mine = [r for r in read if r[0] == name]
            assert "".join(text or "" for _, text, _, _ in mine) == "".join(put[name])
            assert [final for _, _, final, _ in mine] == [False] * (len(mine) - 1) + [True] * (
                len(mine) > 0
            )
            if empty_final and mine:
                assert mine[-1][1] is None and all(t is not None for _, t, _, _ in mine[:-1])
        puts = len(tokens) + (len(last) if empty_final else 0)
        assert len(read) <= puts
        if len(reads) >= len(tokens) and all(reads[: len(tokens)]):
            assert len(read) == puts

    asyncio.run(run())
