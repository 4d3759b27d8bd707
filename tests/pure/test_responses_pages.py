"""A background response's events paged out for another API process
(``ResponsesRunner.page_here``, what a home answers ``Op.RESPONSE_EVENTS`` with): what is ready
at once, else what comes within the wait, else nothing; a page bounded in bytes; the last page
says so; numbers continue where the follower is."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway_server.errors import InvalidRequest, RequestNotFound
from gateway_server.openai.responses import runner as runners
from gateway_server.openai.responses.objects import Answer, Status, encode
from gateway_server.openai.responses.runner import ResponsesRunner
from gateway_server.openai.responses.store import ResponseRecord, ResponseStore


def background(store: ResponseStore, n: int = 1) -> ResponseRecord:
    answer = Answer(f"resp_{n}", "m", {"background": True}, status=Status.QUEUED)
    record = ResponseRecord(answer, str(n), True, True, [])
    store.start(record)
    record.emit([record.events.created(), record.events.queued()])
    answer.status = Status.IN_PROGRESS
    record.emit([record.events.in_progress()])
    return record


def delta(record: ResponseRecord, text: str) -> dict[str, Any]:
    record.answer.text += text
    new = [] if record.answer.started_output else record.events.output_started()
    record.answer.started_output = True
    event = record.events.delta(text)
    record.emit([*new, event])
    return event


@pytest.fixture
def store() -> ResponseStore:
    return ResponseStore(10, 60.0)


@pytest.fixture
def runner(store: ResponseStore, monkeypatch: pytest.MonkeyPatch) -> ResponsesRunner:
    monkeypatch.setattr(runners, "PAGE_WAIT", 0.2)
    return ResponsesRunner(None, store)  # type: ignore[arg-type]  # pages need no service


async def test_what_is_ready_comes_at_once_then_the_next_within_the_wait(
    runner: ResponsesRunner, store: ResponseStore
) -> None:
    record = background(store)
    page = await asyncio.wait_for(runner.page_here(record.id, -1), 0.1)  # no wait: ready
    assert (page.last, page.ended) == (2, False) and page.events.count(b"event: ") == 3
    empty = await runner.page_here(record.id, 2)  # nothing comes: the wait, then nothing
    assert (empty.events, empty.last, empty.ended) == (b"", 2, False)
    waiting = asyncio.create_task(runner.page_here(record.id, 2))
    await asyncio.sleep(0.05)
    first = delta(record, "one")
    page = await waiting
    assert page.last == first["sequence_number"] == 5 and page.events.endswith(encode(first))
    record.answer.status = Status.COMPLETED
    ended = record.events.ended()
    record.emit(ended)
    store.finish(record)
    page = await runner.page_here(record.id, 5)
    assert (page.last, page.ended) == (ended[-1]["sequence_number"], True)
    assert page.events == b"".join(encode(e) for e in ended)
    again = await runner.page_here(record.id, page.last)  # the follower asks once more
    assert (again.events, again.ended) == (b"", True)


async def test_a_page_holds_about_page_bytes(
    runner: ResponsesRunner, store: ResponseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runners, "PAGE_BYTES", 1000)
    record = background(store)
    for _ in range(50):
        delta(record, "x" * 100)
    after, pages = -1, 0
    while after < 54:
        page = await runner.page_here(record.id, after)
        assert len(page.events) < 1000 + 400 and page.last > after
        after, pages = page.last, pages + 1
    assert pages > 5


async def test_only_a_stored_background_response_is_paged(
    runner: ResponsesRunner, store: ResponseStore
) -> None:
    with pytest.raises(RequestNotFound):
        await runner.page_here("resp_nope", -1)
    answer = Answer("resp_2", "m", {}, status=Status.IN_PROGRESS)
    store.start(ResponseRecord(answer, "2", True, False, []))
    with pytest.raises(InvalidRequest, match="only background responses"):
        await runner.page_here("resp_2", -1)
