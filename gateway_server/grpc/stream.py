"""One ``ModelStreamInfer`` stream: Triton's decoupled streaming over one gateway call.

The stream is one call (its id: the ``x-request-id`` metadata); each request on it becomes one
engine request of that call, run in a task of its own as soon as it arrives, so requests overlap
and their responses interleave, each carrying the request's ``id``. One task writes responses to
the stream, in the order they are produced, as bytes: a request's responses are encoded from
parts built once for the request (:mod:`gateway_server.grpc.responses`), not built as messages.

Responses to one request: with input ``stream`` true, one per chunk of text while the writer
keeps up (a request's chunks waiting unwritten are merged into one once it has fallen behind:
the outbox's work, DESIGN.md's "Streams that fall behind"); otherwise one with the whole text.
Each carries the bool parameter ``triton_final_response`` (true on the last), and
the string parameter ``hangup_request_id``: the id that cancels this request alone through the
cancel API (``<call id>:<request id>``; only for requests with an ``id``). A request's ``id`` is
any string, as Triton takes it, of at most 128 characters (the id rule's length,
``hangup_contract.request_id.MAX_LENGTH``): it is echoed in every response twice, named in the
request's log line, and remembered as the alias for a while after the request ends. A longer one
is refused with ``INVALID_ARGUMENT``, and that error response carries no id. A request that set
``triton_enable_empty_final_response`` gets its data responses with the flag false and then an
empty response (no outputs) with the flag true. A request that fails or is cancelled alone is
answered by one response with ``error_message`` (``"<STATUS>: <message>"``); the stream goes on.
A request cancelled alone says in that response's parameters what it consumed up to the cancel
(``prompt_tokens``, ``completion_tokens``, ``total_tokens``, int64).

Bounds (docs/security.md): at most ``max_requests`` requests of a stream are in flight; the
next message is not read until one of them ends, so a client that sends faster than the stream
is answered waits in gRPC's flow control, not in the engine's queue. Responses wait for the
writer in an :class:`~gateway_server.grpc.outbox.Outbox` of ``buffer_bytes``: a client that
stops reading stops its requests (and so, through the cap, the reading of new ones).

Sequences: requests carrying the same ``sequence_id`` run one after the other, in arrival order.
When one of them is cancelled, the requests of that sequence still waiting behind it are
cancelled too.

Cancelling the call (the cancel API with the call id, or shutdown) aborts every request and ends
the stream with status ``CANCELLED``, its trailing metadata ``hangup-usage`` saying what the
whole call consumed (:mod:`gateway_server.grpc.inference`). The client cancelling the stream
(or its deadline) cancels the handler; :meth:`StreamSession.abort` then aborts every request
with the hang-up's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import grpc

from gateway_server.errors import (
    CancelledBeforeArrival,
    GatewayError,
    InvalidRequest,
    RequestCancelled,
)
from gateway_server.grpc.common import parse, refused, status_of
from gateway_server.grpc.outbox import Outbox
from gateway_server.grpc.responses import TextResponses
from gateway_server.grpc.tensors import (
    TextRequest,
    decode_request,
    parameter,
    shown,
    text_response,
)
from gateway_server.labels import Protocol
from gateway_server.openai.fields import check_sampling
from gateway_server.registry import Call
from gateway_server.requests import (
    EMPTY_FINAL_OPT_IN,
    FINAL_FLAG,
    MAX_CHOICES,
    TOKEN_BUDGET_CHAT,
    cancelled_message,
    sampling_params,
)
from gateway_server.service import GenerationService
from hangup_contract import request_id as request_ids
from hangup_contract.cancel_labels import Reason
from hangup_contract.protos import inference_pb2 as pb

MODEL_VERSION = "1"
CANCEL_ID = "hangup_request_id"

Write = Callable[[bytes], Awaitable[None]]
"""Writes one serialized ``ModelStreamInferResponse`` to the stream."""


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one stream may hold (``--grpc-stream-max-requests``, ``--grpc-stream-buffer-bytes``)."""

    max_requests: int = MAX_CHOICES
    """Requests in flight at once, as many as one HTTP call's engine requests."""
    buffer_bytes: int = 256 * 1024
    """Bytes of responses waiting for the writer."""


def cancel_alias(call_id: str, request_id: str) -> str | None:
    """The id that cancels the request ``request_id`` of the stream ``call_id`` alone
    (``<call id>:<request id>``, at most 128 + 1 + 128 characters), None for a request without
    an id. Raises InvalidRequest for a request id longer than 128 characters."""
    if not request_id:
        return None
    if len(request_id) > request_ids.MAX_LENGTH:
        raise InvalidRequest(
            f"request id {shown(request_id)} is too long: a request's id may have at most "
            f"{request_ids.MAX_LENGTH} characters"
        )
    return f"{call_id}:{request_id}"


def _echoed(request_id: str) -> str:
    """The request id an error response carries: none for one too long to be taken."""
    return request_id if len(request_id) <= request_ids.MAX_LENGTH else ""


def prepare(service: GenerationService, request: pb.ModelInferRequest) -> tuple[TextRequest, Any]:
    """Validate one inference request; returns it decoded with its sampling parameters.

    Raises InvalidRequest or ModelNotFound.
    """
    service.check_model(request.model_name)
    text = decode_request(request)
    engine, max_len = service.engine, service.model.max_model_len
    check_sampling(text.sampling, engine.features, engine.name, strict=True)
    params = sampling_params(
        text.sampling, engine, max_model_len=max_len, default_max_tokens=16,
        budget=TOKEN_BUDGET_CHAT,
    )  # fmt: skip
    service.check_prompt(text.prompt, params)
    return text, params


@dataclass
class _Sequence:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    members: int = 0
    """Requests of the sequence waiting or running; the entry is dropped at zero."""
    epoch: int = 0
    """Bumped when a request of the sequence is cancelled: requests that arrived in an earlier
    epoch and are still waiting are cancelled with it."""


class StreamSession:
    def __init__(
        self, service: GenerationService, call: Call, limits: StreamLimits | None = None
    ) -> None:
        limits = limits or StreamLimits()
        self._service = service
        self._call = call
        self._out = Outbox(limits.buffer_bytes)
        self._slots = asyncio.Semaphore(limits.max_requests)
        """One per request in flight; the reader holds one while it waits for a message."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._sequences: dict[object, _Sequence] = {}
        self.cancelled: Reason | None = None
        """Set when the call itself was cancelled: the stream ends with CANCELLED."""

    async def serve(self, requests: AsyncIterator[bytes], write: Write) -> None:
        """Answer every request on the stream; returns when the client has sent its last one
        and every answer is written, or when the call was cancelled."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while (response := await self._out.get()) is not None:
                await write(response)  # waits while the client's flow-control window is full
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader  # raises what broke the reading of requests, if anything did

    async def abort(self) -> None:
        """Cancel every request in flight and wait until each has aborted on its engine."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            await self._slots.acquire()
            async for raw in requests:
                if self.cancelled is not None:
                    break
                await self._start(raw)  # the slot goes to the request, or back when refused
                await self._slots.acquire()  # a slot for the next message before reading it
            # asyncio.wait, not gather: cancelling this reader must not cancel the requests
            # (the handler cancels them itself, once it has recorded why).
            if self._tasks:
                await asyncio.wait(set(self._tasks))
        finally:
            self._out.close()  # whatever ended the reading ends the stream

    async def _start(self, raw: bytes) -> None:
        request = pb.ModelInferRequest()
        try:
            request = parse(pb.ModelInferRequest, raw)
            alias = cancel_alias(self._call.call_id, request.id)
            text, params = prepare(self._service, request)
            sequence = self._sequence(request)
        except GatewayError as exc:
            if refused(exc):
                self._service.record_rejected(request.model_name, Protocol.KSERVE_GRPC)
            self._slots.release()
            await self._error(request, exc)
            return
        task = asyncio.create_task(self._answer(request, alias, text, params, sequence))
        self._tasks.add(task)
        task.add_done_callback(self._request_ended)

    def _request_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    def _sequence(self, request: pb.ModelInferRequest) -> tuple[_Sequence, int] | None:
        sequence_id = parameter(request, "sequence_id")
        if sequence_id is None or sequence_id in (0, ""):
            return None
        if not isinstance(sequence_id, int | str) or isinstance(sequence_id, bool):
            raise InvalidRequest("parameter 'sequence_id' must be an integer or a string")
        sequence = self._sequences.setdefault(sequence_id, _Sequence())
        sequence.members += 1
        return sequence, sequence.epoch

    async def _answer(
        self,
        request: pb.ModelInferRequest,
        alias: str | None,
        text: TextRequest,
        params: Any,
        sequence: tuple[_Sequence, int] | None,
    ) -> None:
        if sequence is None:
            await self._guarded(request, alias, text, params, None)
            return
        state, epoch = sequence
        try:
            async with state.lock:
                if state.epoch != epoch:
                    await self._error(
                        request,
                        RequestCancelled(Reason.EXPLICIT),
                        "an earlier request of its sequence was cancelled",
                    )
                    return
                await self._guarded(request, alias, text, params, state)
        finally:
            state.members -= 1
            if not state.members:
                self._sequences.pop(parameter(request, "sequence_id"), None)

    async def _guarded(
        self,
        request: pb.ModelInferRequest,
        alias: str | None,
        text: TextRequest,
        params: Any,
        seq: _Sequence | None,
    ) -> None:
        try:
            await self._generate(request, alias, text, params)
        except (RequestCancelled, CancelledBeforeArrival) as exc:
            if self._call.cancel_reason is not None:
                self._end_call(self._call.cancel_reason)
                return
            if seq is not None:
                seq.epoch += 1
            await self._error(request, exc)
        except GatewayError as exc:
            await self._error(request, exc)

    async def _generate(
        self, request: pb.ModelInferRequest, alias: str | None, text: TextRequest, params: Any
    ) -> None:
        empty_final = parameter(request, EMPTY_FINAL_OPT_IN) is True
        extra = {CANCEL_ID: alias} if alias else {}
        responses = TextResponses(request.model_name, MODEL_VERSION, request.id, FINAL_FLAG, extra)
        whole = "" if text.exclude_input_in_output or text.stream else text.prompt
        generation = self._service.generate(self._call, text.prompt, params, alias=alias)
        async with aclosing(generation) as chunks:
            async for chunk in chunks:
                last = chunk.finish_reason is not None
                if not text.stream:
                    whole += chunk.text
                elif chunk.text or (last and not empty_final):
                    # Merged into the request's response still waiting, if the writer is
                    # behind; waits at the outbox's limit: the engine request is read no further.
                    await self._out.put_text(
                        responses, chunk.text.encode(), last and not empty_final
                    )
        if not text.stream:
            await self._out.put_text(responses, whole.encode(), not empty_final)
        if empty_final:
            await self._out.put_text(responses, None, True)

    async def _error(
        self,
        request: pb.ModelInferRequest,
        exc: GatewayError | RequestCancelled,
        message: str | None = None,
    ) -> None:
        parameters: dict[str, bool | int] = {FINAL_FLAG: True}
        if isinstance(exc, RequestCancelled):
            code, text = grpc.StatusCode.CANCELLED, cancelled_message(exc.reason)
            parameters |= exc.usage.to_json()  # what it consumed up to the cancel
        else:
            code, text = status_of(exc), exc.message
        reply_id = _echoed(request.id)
        response = text_response(request.model_name, MODEL_VERSION, reply_id, None, parameters)
        error = pb.ModelStreamInferResponse(
            error_message=f"{code.name}: {message or text}", infer_response=response
        )
        await self._out.put(error.SerializeToString())

    def _end_call(self, reason: Reason) -> None:
        if self.cancelled is None:
            self.cancelled = reason
            self._out.close()
