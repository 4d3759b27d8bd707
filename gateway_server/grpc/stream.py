"""One ``ModelStreamInfer`` stream: Triton's decoupled streaming over one gateway call.

The stream is one call (its id: the ``x-request-id`` metadata); each request on it becomes one
engine request of that call, run in a task of its own as soon as it arrives, so requests overlap
and their responses interleave, each carrying the request's ``id``. One task writes responses to
the stream, in the order they are produced, as bytes: a request's responses are encoded from
parts built once for the request (:mod:`gateway_server.grpc.responses`), not built as messages.

Responses to one request: with input ``stream`` true, one per chunk of text; otherwise one with
the whole text. Each carries the bool parameter ``triton_final_response`` (true on the last), and
the string parameter ``hangup_request_id``: the id that cancels this request alone through the
cancel API (``<call id>:<request id>``; only for requests with an ``id``). A request that set
``triton_enable_empty_final_response`` gets its data responses with the flag false and then an
empty response (no outputs) with the flag true. A request that fails or is cancelled alone is
answered by one response with ``error_message`` (``"<STATUS>: <message>"``); the stream goes on.

Sequences: requests carrying the same ``sequence_id`` run one after the other, in arrival order.
When one of them is cancelled, the requests of that sequence still waiting behind it are
cancelled too.

Cancelling the call (the cancel API with the call id, or shutdown) aborts every request and ends
the stream with status ``CANCELLED``. The client cancelling the stream (or its deadline) cancels
the handler; :meth:`StreamSession.abort` then aborts every request with the hang-up's reason.
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
from gateway_server.grpc.responses import TextResponses
from gateway_server.grpc.tensors import TextRequest, decode_request, parameter, text_response
from gateway_server.openai.fields import check_sampling
from gateway_server.registry import Call
from gateway_server.requests import (
    EMPTY_FINAL_OPT_IN,
    FINAL_FLAG,
    TOKEN_BUDGET_CHAT,
    cancelled_message,
    sampling_params,
)
from gateway_server.service import GenerationService
from gateway_server.vocabulary import Protocol
from hangup_contract.protos import inference_pb2 as pb
from hangup_contract.vocabulary import Reason

MODEL_VERSION = "1"
CANCEL_ID = "hangup_request_id"

Write = Callable[[bytes], Awaitable[None]]
"""Writes one serialized ``ModelStreamInferResponse`` to the stream."""


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
    def __init__(self, service: GenerationService, call: Call) -> None:
        self._service = service
        self._call = call
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
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
                await write(response)
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
            async for raw in requests:
                if self.cancelled is not None:
                    break
                self._start(raw)
            # asyncio.wait, not gather: cancelling this reader must not cancel the requests
            # (the handler cancels them itself, once it has recorded why).
            if self._tasks:
                await asyncio.wait(set(self._tasks))
        finally:
            self._out.put_nowait(None)  # whatever ended the reading ends the stream

    def _start(self, raw: bytes) -> None:
        request = pb.ModelInferRequest()
        try:
            request = parse(pb.ModelInferRequest, raw)
            text, params = prepare(self._service, request)
            sequence = self._sequence(request)
        except GatewayError as exc:
            if refused(exc):
                self._service.record_rejected(request.model_name, Protocol.KSERVE_GRPC)
            self._error(request, exc)
            return
        task = asyncio.create_task(self._answer(request, text, params, sequence))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        text: TextRequest,
        params: Any,
        sequence: tuple[_Sequence, int] | None,
    ) -> None:
        if sequence is None:
            await self._guarded(request, text, params, None)
            return
        state, epoch = sequence
        try:
            async with state.lock:
                if state.epoch != epoch:
                    self._error(
                        request,
                        RequestCancelled(Reason.EXPLICIT),
                        "an earlier request of its sequence was cancelled",
                    )
                    return
                await self._guarded(request, text, params, state)
        finally:
            state.members -= 1
            if not state.members:
                self._sequences.pop(parameter(request, "sequence_id"), None)

    async def _guarded(
        self, request: pb.ModelInferRequest, text: TextRequest, params: Any, seq: _Sequence | None
    ) -> None:
        try:
            await self._generate(request, text, params)
        except (RequestCancelled, CancelledBeforeArrival) as exc:
            if self._call.cancel_reason is not None:
                self._end_call(self._call.cancel_reason)
                return
            if seq is not None:
                seq.epoch += 1
            self._error(request, exc)
        except GatewayError as exc:
            self._error(request, exc)

    async def _generate(
        self, request: pb.ModelInferRequest, text: TextRequest, params: Any
    ) -> None:
        alias = f"{self._call.call_id}:{request.id}" if request.id else None
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
                    self._out.put_nowait(responses.encode(chunk.text, last and not empty_final))
        if not text.stream:
            self._out.put_nowait(responses.encode(whole, not empty_final))
        if empty_final:
            self._out.put_nowait(responses.encode(None, True))

    def _error(
        self,
        request: pb.ModelInferRequest,
        exc: GatewayError | RequestCancelled,
        message: str | None = None,
    ) -> None:
        if isinstance(exc, RequestCancelled):
            code, text = grpc.StatusCode.CANCELLED, cancelled_message(exc.reason)
        else:
            code, text = status_of(exc), exc.message
        response = text_response(
            request.model_name, MODEL_VERSION, request.id, None, {FINAL_FLAG: True}
        )
        error = pb.ModelStreamInferResponse(
            error_message=f"{code.name}: {message or text}", infer_response=response
        )
        self._out.put_nowait(error.SerializeToString())

    def _end_call(self, reason: Reason) -> None:
        if self.cancelled is None:
            self.cancelled = reason
            self._out.put_nowait(None)
