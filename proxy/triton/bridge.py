"""HTTP calls that run a model carried to Triton over gRPC (``--cancel-adapter triton``):
``/infer``, ``/generate`` and ``/generate_stream``, so that a client's hang-up is a cancelled gRPC
call, which Triton turns into the request's cancellation. Over HTTP Triton notices no hang-up
(Triton issue 7077): a model keeps running for a client that left.

The body is read whole (``--max-body-size``), and made into a request before anything goes up (a
body of 256 KiB or more in a worker thread, one at a time, so that the event loop serves other
calls meanwhile); the model and route are read from the path as sent, as Triton reads them.
``/infer`` (KServe v2 JSON tensors and the binary tensor extension, :mod:`.infer`) is one
``ModelInfer``; on a decoupled model it is answered 501, as Triton answers it. ``generate``
(:mod:`.codec`: JSON keys to inputs typed by the model's metadata, :mod:`.models`) on a model that
is not decoupled is one ``ModelInfer``; on a decoupled model, and for ``generate_stream``, one
``ModelStreamInfer`` carrying the one request, read until Triton ends it. Answers are written as
Triton's HTTP frontend writes them: ``/infer`` its JSON (with the binary outputs after it when
asked for), ``generate`` one JSON object (a decoupled model's several responses refused as Triton
refuses them), ``generate_stream`` one ``data:`` event per response as it arrives, an error
mid-stream as a ``data: {"error": ...}`` event. Errors before an answer are ``{"error": message}``
with the HTTP status Triton gives the gRPC status (an error that arrives in the stream, which
carries no status, is a 400: they are the request's). A generate request goes up without an id, as
Triton's HTTP frontend sends it, so Triton's messages read the same.

How a call ends is the relay's (``proxy.http.relay``): its hang-up, in any stage, cancels the
gRPC call (the relay's ``close_upstream``), and Triton cancels the request.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc

from hangup_contract.protos import inference_pb2 as pb
from proxy.calls.state import Call
from proxy.errors import ClientGone, UpstreamBroken
from proxy.labels import Stage
from proxy.messages import Answer, Request, Stream
from proxy.triton.codec import (
    GenerateError,
    answer,
    built,
    encode,
    generate_request,
    parse_body,
)
from proxy.triton.infer import HEADER_LENGTH, infer_answer, infer_request
from proxy.triton.models import SERVICE, Models
from proxy.upstream.grpc_target import upstream_channel

PATH = re.compile(
    r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
    r"/(?P<route>infer|generate|generate_stream)$"
)
EVENT_STREAM = "text/event-stream; charset=utf-8"
OFF_LOOP_AT = 256 * 1024  # a body this large is read into a request in a worker thread
T = TypeVar("T")
DECOUPLED = b'{"error":"HTTP end point doesn\'t support models with decoupled transaction policy"}'
SEVERAL = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
# The HTTP status Triton's HTTP frontend gives each error it would have made over gRPC.
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.UNIMPLEMENTED: 400,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}


def route(request: Request) -> re.Match[str] | None:
    """The model, version and route a request names, read from its path as sent (Triton's HTTP
    frontend decodes no percent escapes: ``/v2/models/%73low/infer`` names no model ``slow``, and
    ``/v2/models/slow/%69nfer`` no route)."""
    return PATH.match(request.raw_path.partition("?")[0])


class Upstream:
    """The gRPC call a bridged exchange has open, for the relay to cancel on a hang-up."""

    def __init__(self) -> None:
        self.call: grpc.aio.Call | None = None

    def cancel(self) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()


class TritonBridge:
    def __init__(self, target: str) -> None:
        self._channel = upstream_channel(target)
        self.models = Models(self._channel)
        self._reading = asyncio.Semaphore(1)  # large bodies read off the loop, one at a time
        self._infer = self._channel.unary_unary(
            SERVICE + "ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        self._stream = self._channel.stream_stream(
            SERVICE + "ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )

    async def close(self) -> None:
        await self._channel.close()

    async def _read(self, raw: bytes, build: Callable[[], T]) -> T:
        """``build()``, the body read into a request: a body of ``OFF_LOOP_AT`` bytes or more
        in a worker thread, one at a time, so that the event loop answers other calls meanwhile
        (the two take turns every 5 ms, Python's switch interval, except during one call into
        C, such as msgspec's decode: a few hundred ms at most for 8 MiB; several such threads
        at once would take turns among themselves too, and the loop would wait for each), with
        the garbage collector paused (:func:`.codec.built`)."""
        if len(raw) < OFF_LOOP_AT:
            return build()
        async with self._reading:
            return await asyncio.to_thread(built, build)

    @staticmethod
    def takes(request: Request) -> bool:
        return request.method == "POST" and route(request) is not None

    async def relay(
        self,
        request: Request,
        call: Call,
        raw: bytes,
        upstream: Upstream,
        opened: Callable[[], None],
        headers: Mapping[str, str],
    ) -> Answer | Stream:
        """Answer ``request`` (its body ``raw``) from Triton over gRPC, with ``headers`` (the
        proxy's own: the call's id, ``Server``) on every answer. ``opened`` is called once the
        gRPC call is open (from then on a hang-up cancels it through ``upstream``)."""
        match = route(request)
        assert match is not None
        model, version = match["model"], match["version"] or ""
        try:
            response = await self._answer(match, request, call, raw, upstream, opened, headers)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the handler's own cancellation (its client left, shutdown)
            # Only the gRPC call was cancelled (``Upstream.cancel``, a cancel by id): an end of
            # the upstream call, as a broken connection is to the relay.
            raise UpstreamBroken("the gRPC call to Triton was cancelled") from None
        except grpc.aio.AioRpcError as exc:
            response = _rpc_error(call, exc)
            if match["route"] == "infer" and exc.code() is grpc.StatusCode.NOT_FOUND:
                response.content_type = "text/plain"  # as Triton labels this one
        if call.status in (400, 404):  # the model may have changed: its metadata is read again
            self.models.forget(model, version)
        if isinstance(response, Answer):  # a stream was started with them
            response.headers.update(headers)
        return response

    async def _answer(
        self,
        match: re.Match[str],
        request: Request,
        call: Call,
        raw: bytes,
        upstream: Upstream,
        opened: Callable[[], None],
        headers: Mapping[str, str],
    ) -> Answer | Stream:
        model, version, route = match["model"], match["version"] or "", match["route"]
        try:
            inputs = await self.models.inputs(model, version)
            if route == "infer":
                if inputs.decoupled:  # as Triton answers it (its JSON, labelled text/plain)
                    return _sent(call, Answer(501, DECOUPLED, content_type="text/plain"))
                length = request.header(HEADER_LENGTH)
                infer, binary, all_binary = await self._read(
                    raw, lambda: infer_request(inputs, raw, length)
                )
            else:
                infer = await self._read(raw, lambda: generate_request(inputs, parse_body(raw)))
        except GenerateError as exc:
            return _error(call, exc.status, exc.message)
        sent = time.monotonic()
        if route == "infer":
            unary = upstream.call = self._infer(infer)
            opened()
            try:
                response = await unary
                body, headers = infer_answer(response, binary, all_binary)
            except grpc.aio.AioRpcError as exc:
                return _rpc_error(call, exc)
            except GenerateError as exc:
                return _error(call, exc.status, exc.message)
            call.upstream_ttfb = time.monotonic() - sent
            return _sent(call, Answer(200, body, headers=headers))
        if route == "generate" and not inputs.decoupled:
            unary = upstream.call = self._infer(infer)
            opened()
            try:
                response = await unary
                call.upstream_ttfb = time.monotonic() - sent
                return _json(call, 200, answer(response, outputs_first=True))
            except grpc.aio.AioRpcError as exc:
                return _rpc_error(call, exc)
            except GenerateError as exc:  # an output JSON cannot carry
                return _error(call, exc.status, exc.message)
        stream = upstream.call = self._stream()
        opened()
        try:
            await stream.write(infer)
            await stream.done_writing()
        except grpc.aio.AioRpcError as exc:  # Triton unreachable, or the call refused at once
            return _rpc_error(call, exc)
        first = not inputs.decoupled  # Triton writes such a model's outputs first
        if route == "generate":
            return await _collected(call, stream, sent, first)
        return await _streamed(request, call, stream, sent, first, headers)


async def _collected(call: Call, stream: Any, sent: float, first: bool) -> Answer:
    """``generate`` on a decoupled model: its one response (several are refused)."""
    responses: list[pb.ModelInferResponse] = []
    try:
        async for message in stream:
            call.upstream_ttfb = call.upstream_ttfb or time.monotonic() - sent
            if message.error_message:
                return _error(call, 400, message.error_message)
            responses.append(message.infer_response)
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(call, exc)
    if len(responses) != 1:
        return _json(call, 200, {"error": SEVERAL})
    try:
        return _json(call, 200, answer(responses[0], outputs_first=first))
    except GenerateError as exc:  # an output JSON cannot carry
        return _error(call, exc.status, exc.message)


async def _streamed(
    request: Request,
    call: Call,
    stream: Any,
    sent: float,
    first: bool,
    headers: Mapping[str, str],
) -> Answer | Stream:
    """``generate_stream``: one event per response, written as it arrives."""
    response: Stream | None = None
    try:
        async for message in stream:
            if response is None:
                call.upstream_ttfb = time.monotonic() - sent
                if message.error_message:
                    return _error(call, 400, message.error_message)
                response = _start(request, call, headers)
            data = stream_event(message, first)
            await _write(response, call, b"data: " + data + b"\n\n")
    except grpc.aio.AioRpcError as exc:
        if response is None:
            return _rpc_error(call, exc)
        await _write(response, call, b"data: " + encode({"error": exc.details()}) + b"\n\n")
    if response is None:  # no response at all: Triton answers 200 with an empty stream
        response = _start(request, call, headers)
    return response


def stream_event(message: pb.ModelStreamInferResponse, first: bool) -> bytes:
    """One ``generate_stream`` event's JSON: the response, or its error (one an output JSON
    cannot carry included: the stream has begun, so it is an event, not a status)."""
    if message.error_message:
        return encode({"error": message.error_message})
    try:
        return encode(answer(message.infer_response, outputs_first=first))
    except GenerateError as exc:
        return encode({"error": exc.message})


def _start(request: Request, call: Call, headers: Mapping[str, str]) -> Stream:
    response = Stream(200, headers=[("Content-Type", EVENT_STREAM), *headers.items()])
    try:
        response.start(request)
    except ConnectionResetError as exc:
        raise ClientGone(f"the client left before the response began: {exc}") from exc
    call.stage, call.status = Stage.STREAMING, 200
    return response


async def _write(response: Stream, call: Call, data: bytes) -> None:
    try:
        await response.write(data)
    except ConnectionResetError as exc:
        raise ClientGone(f"the client left mid-response: {exc}") from exc
    call.bytes_out += len(data)
    call.chunks_out += 1


def _sent(call: Call, response: Answer) -> Answer:
    call.status = response.status
    call.bytes_out += len(response.body)
    return response


def _json(call: Call, status: int, body: object) -> Answer:
    data = encode(body)
    call.status = status
    call.bytes_out += len(data)
    return Answer(status, data, content_type="application/json")


def _error(call: Call, status: int, message: str) -> Answer:
    call.error = message
    return _json(call, status, {"error": message})


def _rpc_error(call: Call, exc: grpc.aio.AioRpcError) -> Answer:
    return _error(call, _STATUS.get(exc.code(), 500), exc.details() or str(exc.code()))
