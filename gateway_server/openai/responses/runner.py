"""How Responses API responses run, whatever carries them (the HTTP adapter's routes).

- synchronous and streaming ones: in the call their handler opened, under the request's id
  (:meth:`ResponsesRunner.run`), events emitted as they are made;
- background ones: each as a task of the runner's, a call of its own under a fresh id
  (:meth:`ResponsesRunner.start_background`); only its cancel or the gateway's shutdown stops it.

A response's id is the gateway's own: ``resp_`` and 128 random bits (:meth:`fresh_id`; with API
processes, drawn so that its home is the process holding it), never derived from anything a
client sent; a background response's call runs under the same 32 hex digits. The id is what a
client holds of its response: :meth:`ResponsesRunner.cancel`, :meth:`~ResponsesRunner.retrieve`,
:meth:`~ResponsesRunner.delete`, :meth:`~ResponsesRunner.events` and
:meth:`~ResponsesRunner.earlier` act only on the response record it names, here or, with API
processes, at its home (each ``*_here`` method is what a home answers), never on another call.

The runner owns the store of responses in flight and stored (:mod:`.store`) and its background
tasks; :meth:`ResponsesRunner.stop` ends those still running, a named step of the gateway's
shutdown (after the drain, before the listeners close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from gateway_server.engine.base import FinishReason
from gateway_server.errors import GatewayError, InvalidRequest, RequestCancelled, RequestNotFound
from gateway_server.labels import Protocol
from gateway_server.openai.responses.objects import Answer, Status
from gateway_server.openai.responses.request import ResponsesJob
from gateway_server.openai.responses.store import ResponseRecord, ResponseStore
from gateway_server.registry import Call
from gateway_server.service import GenerationService
from gateway_server.siblings.responses import PAGE_BYTES, PAGE_WAIT
from gateway_server.siblings.scope import Page, ResponseHomes
from hangup_contract import request_id as request_ids
from hangup_contract.cancel_labels import Reason
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")

PREFIX = "resp_"
Emit = Callable[[list[dict[str, Any]]], Awaitable[None]]


class ResponsesRunner:
    def __init__(
        self,
        service: GenerationService,
        store: ResponseStore,
        homes: ResponseHomes | None = None,
    ) -> None:
        """``homes``: the other API processes, where a response id made by one of them is
        found (None: this process is the gateway)."""
        self.service = service
        self.store = store
        self.homes = homes

    def fresh_id(self) -> str:
        """A new response id: ``resp_`` and a fresh random call id (whose home is this process,
        with API processes: a route landing on another finds it there)."""
        return PREFIX + self.service.fresh_call_id()

    def _home(self, response_id: str) -> ResponseHomes | None:
        """Where ``response_id``, held nowhere here, may be: its home process (None: nowhere).
        Only an id of a response id's shape is ever asked of another process."""
        if self.store.get(response_id) is not None or not is_response_id(response_id):
            return None
        return self.homes

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Cancel the response ``response_id`` names (reason ``explicit``), wherever it is
        held; answer its object once it ended. Idempotent (an ended one answers its final
        status). Raises RequestNotFound for an id that names no response in flight or stored
        (no tombstone is left: a response id is never a call's)."""
        home = self._home(response_id)
        return await (self.cancel_here if home is None else home.cancel)(response_id)

    async def cancel_here(self, response_id: str) -> dict[str, Any]:
        """:meth:`cancel` for a response held in this process only (a sibling's question)."""
        record = self.store.get(response_id)
        if record is None:
            raise response_not_found(response_id)
        if not record.ended:
            with contextlib.suppress(RequestNotFound):  # it ended meanwhile
                await self.service.cancel(record.call_id, Reason.EXPLICIT)
            await record.wait_ended()  # the engine confirmed its abort: the run is ending now
        return record.answer.to_json()

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        """A stored response's object, in flight or ended, wherever it is held (``GET``).
        Raises RequestNotFound (a ``store: false`` response is never found)."""
        home = self._home(response_id)
        return self.retrieve_here(response_id) if home is None else await home.retrieve(response_id)

    def retrieve_here(self, response_id: str) -> dict[str, Any]:
        return self._stored_here(response_id).answer.to_json()

    async def delete(self, response_id: str) -> dict[str, Any]:
        """Forget a stored response, wherever it is held (``DELETE``); the deletion's answer.
        Raises RequestNotFound, or InvalidRequest while it runs (cancel it first)."""
        home = self._home(response_id)
        return self.delete_here(response_id) if home is None else await home.delete(response_id)

    def delete_here(self, response_id: str) -> dict[str, Any]:
        record = self._stored_here(response_id)
        if not record.ended:
            raise InvalidRequest(
                f"response {record.id} is {record.answer.status}: cancel it before deleting it"
            )
        self.store.delete(record.id)
        return {"id": record.id, "object": "response", "deleted": True}

    async def events(self, response_id: str, after: int) -> AsyncGenerator[bytes, None]:
        """A background response's events numbered after ``after``, as SSE, then each new one
        until the last, wherever it is held (``GET ...?stream=true``). Raises before the first
        event: RequestNotFound, or InvalidRequest for a response that is not a background one.
        From another process the events come a page at a time (its first read here)."""
        home = self._home(response_id)
        if home is None:
            record = self._stored_here(response_id)
            _check_background(record)
            return followed(record, after)
        return _paged(home, response_id, await home.page(response_id, after))

    async def page_here(self, response_id: str, after: int) -> Page:
        """The events after ``after`` that are ready, else the next ones within
        ``PAGE_WAIT`` (nothing if none comes), up to about ``PAGE_BYTES``."""
        record = self._stored_here(response_id)
        _check_background(record)
        chunks: list[bytes] = []
        last, size, ended = after, 0, False
        following = record.follow(after)
        try:
            async with asyncio.timeout(PAGE_WAIT) as deadline:
                async for last, chunk in following:  # noqa: B007 (last: the page's)
                    chunks.append(chunk)
                    size += len(chunk)
                    if size >= PAGE_BYTES:
                        break
                    deadline.reschedule(asyncio.get_running_loop().time())  # no more waiting
                else:
                    ended = True
        except TimeoutError:
            pass  # what was ready (or nothing, past the wait): the follower asks again
        finally:
            await following.aclose()
        return Page(b"".join(chunks), last, ended)

    async def run(
        self, call: Call, record: ResponseRecord, job: ResponsesJob, emit: Emit | None
    ) -> None:
        """Generate the answer into ``record``, emitting its events from ``in_progress`` on
        (none are built without ``emit``: a synchronous response). Ends with the record's final
        status (a client that left: cancelled, and the CancelledError goes on)."""
        service = self.service
        answer, events = record.answer, record.events
        answer.status = Status.IN_PROGRESS
        finish: FinishReason | None = None
        try:
            if emit is not None:
                await emit([events.in_progress()])
            async with aclosing(service.generate(call, job.prompt, job.params)) as chunks:
                async for chunk in chunks:
                    started = answer.started_output
                    answer.started_output = True
                    answer.input_tokens = chunk.prompt_tokens
                    answer.output_tokens += chunk.new_tokens
                    finish = chunk.finish_reason or finish
                    answer.text += chunk.text
                    if emit is not None and (chunk.text or not started):
                        new = [] if started else events.output_started()
                        await emit([*new, events.delta(chunk.text)] if chunk.text else new)
            answer.status = Status.INCOMPLETE if finish is FinishReason.LENGTH else Status.COMPLETED
        except RequestCancelled as exc:  # its usage: what the engine used, read or not
            answer.status = Status.CANCELLED
            answer.input_tokens = exc.usage.prompt_tokens or answer.input_tokens
            answer.output_tokens = max(exc.usage.completion_tokens, answer.output_tokens)
        except GatewayError as exc:
            answer.status = Status.FAILED
            answer.error = {"code": exc.error_type, "message": exc.message}
        finally:
            if not answer.status.ended:  # the client left (or its socket broke) mid-way
                answer.status = Status.CANCELLED
            answer.completed_at = int(time.time())
            record.turns.append({"role": "assistant", "content": answer.text})
        if emit is not None:
            await emit(events.ended())

    async def start_background(
        self, job: ResponsesJob, client: str = "", group: str | None = None
    ) -> ResponseRecord:
        """Start a background response for ``client`` as a task of its own (its call in
        ``group``, if given: a group cancel stops it); return its record once its call holds its
        id. Raises TooManyRequests past the store's bounds (the client's share included), and
        what opening the call raises (the gateway drains, a bound on groups)."""
        call_id = self.service.fresh_call_id()
        record = new_record(job, call_id, PREFIX + call_id, client)
        self.store.start(record)
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        record.task = asyncio.create_task(self._work(record, job, opened, group))
        await asyncio.shield(opened)  # a client leaving here must not cancel the work
        return record

    async def _work(
        self,
        record: ResponseRecord,
        job: ResponsesJob,
        opened: asyncio.Future[None],
        group: str | None = None,
    ) -> None:
        """A background response's task: its own call; ``opened`` once it holds its id."""

        async def keep(events: list[dict[str, Any]]) -> None:
            record.emit(events)

        try:
            model, client = job.model, record.client
            opening = self.service.call(record.call_id, model, Protocol.OPENAI, client, group)
            async with opening as call:
                call.hangup_reason = Reason.SHUTDOWN  # only shutdown cancels this task
                record.emit([record.events.created(), record.events.queued()])
                opened.set_result(None)
                try:
                    await self.run(call, record, job, keep)
                finally:
                    self.store.finish(record)
        except GatewayError as exc:  # the call did not open (draining): nothing ran
            if opened.done():
                raise
            self.store.forget(record)
            opened.set_exception(exc)
        finally:
            if not opened.done():
                self.store.forget(record)
                opened.cancel()

    async def stop(self) -> None:
        """At shutdown, after the drain: background responses still running end cancelled."""
        tasks = self.store.tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def earlier(self, previous: object) -> list[dict[str, Any]] | None:
        """The turns a ``previous_response_id`` continues, wherever the response is held.
        Raises RequestNotFound or InvalidRequest naming the field."""
        if previous is None:
            return None
        if not isinstance(previous, str):
            message = "'previous_response_id' must be a string"
            raise InvalidRequest(message, param="previous_response_id")
        home = self._home(previous)
        if home is None:
            return self.turns_here(previous)
        try:
            return await home.turns(previous)
        except RequestNotFound:
            raise _no_previous(previous) from None

    def turns_here(self, response_id: str) -> list[dict[str, Any]]:
        record = self.store.get(response_id)
        if record is None or not record.store:
            raise _no_previous(response_id)
        if not record.ended:
            raise InvalidRequest(
                f"response {response_id} is still {record.answer.status}: wait for it to end",
                param="previous_response_id",
            )
        return list(record.turns)

    def _stored_here(self, response_id: str) -> ResponseRecord:
        record = self.store.get(response_id)
        if record is None or not record.store:  # store: false: held only to be cancelled
            raise response_not_found(response_id)
        return record


async def followed(record: ResponseRecord, after: int) -> AsyncGenerator[bytes, None]:
    """A background response's events after ``after``, as SSE, from this process's record."""
    async with aclosing(record.follow(after)) as events:
        async for _, chunk in events:
            yield chunk


async def _paged(home: ResponseHomes, response_id: str, page: Page) -> AsyncGenerator[bytes, None]:
    """The events a home pages out, the first page read; until the last. A home that stops
    answering ends the stream where it is (logged), as one whose process died."""
    while True:
        if page.events:
            yield page.events
        if page.ended:
            return
        try:
            page = await home.page(response_id, page.last)
        except GatewayError as exc:
            fields = {"response_id": response_id, "after": page.last, "error": exc.message}
            log_event(log, "response_events_lost", logging.WARNING, **fields)
            return


def _check_background(record: ResponseRecord) -> None:
    if not record.background:
        raise InvalidRequest("only background responses can be streamed again", param="stream")


def _no_previous(response_id: str) -> RequestNotFound:
    shown = response_id if len(response_id) <= 200 else response_id[:200] + "..."
    return RequestNotFound(f"no stored response with id {shown!r}", param="previous_response_id")


def is_response_id(response_id: str) -> bool:
    """Whether ``response_id`` has the shape of one: ``resp_`` and an id by the id rule."""
    call_id = response_id.removeprefix(PREFIX)
    return call_id != response_id and request_ids.is_valid(call_id)


def response_not_found(response_id: str) -> RequestNotFound:
    shown = response_id if len(response_id) <= 200 else response_id[:200] + "..."
    return RequestNotFound(
        f"no response with id {shown!r} is in flight or stored here", param="response_id"
    )


def new_record(
    job: ResponsesJob, call_id: str, response_id: str, client: str = ""
) -> ResponseRecord:
    """The record of a response ``response_id`` (the gateway's own, :meth:`fresh_id`) that
    runs under the call ``call_id``, for ``client`` (whose shares it counts in)."""
    settings = {
        "background": job.background,
        "instructions": job.instructions,
        "max_output_tokens": job.max_output_tokens,
        "metadata": job.metadata or {},
        "previous_response_id": job.previous_response_id,
        "store": job.store,
        "temperature": job.temperature,
        "text": {"format": job.text_format},
        "top_p": job.top_p,
        "truncation": "disabled",
    }
    status = Status.QUEUED if job.background else Status.IN_PROGRESS
    answer = Answer(response_id, job.model, settings, status=status)
    return ResponseRecord(answer, call_id, job.store, job.background, list(job.turns), client)
