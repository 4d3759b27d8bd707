"""Request messages that do not decode are ``INVALID_ARGUMENT``, on every service.

grpc's aio server answers a request whose bytes its deserializer cannot parse with ``UNKNOWN``
("Unexpected DecodeError"), which reads like a server fault and tells the client nothing. hangup's
inference service parses its own messages (:func:`gateway_server.grpc.common.parse`); this
interceptor does the same for every other handler (the cancel service, health, reflection): it
takes the handler's deserializer out and decodes in the behaviour instead, so that a message that
is not the method's type ends the call with ``INVALID_ARGUMENT`` naming the type. Handlers that
take raw bytes are returned unchanged, and the interceptor runs once per call, not per message.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

Decode = Callable[[bytes], Any]


async def _decoded(decode: Decode, raw: bytes, context: Any) -> Any:
    try:
        return decode(raw)
    except Exception:  # protobuf raises DecodeError; a custom deserializer may raise anything
        owner = getattr(getattr(decode, "__self__", None), "DESCRIPTOR", None)
        name = owner.full_name if owner is not None else "request message of this method"
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the message is not a valid {name}")


async def _decoded_stream(decode: Decode, requests: AsyncIterator[bytes], context: Any) -> Any:
    async for raw in requests:
        yield await _decoded(decode, raw, context)


def _wrap(behaviour: Any, decode: Decode, streaming_requests: bool) -> Any:
    async def first(request: Any, context: Any) -> Any:
        if streaming_requests:
            return _decoded_stream(decode, request, context)
        return await _decoded(decode, request, context)

    if inspect.isasyncgenfunction(behaviour):

        async def generating(request: Any, context: Any) -> Any:
            async for response in behaviour(await first(request, context), context):
                yield response

        return generating

    async def answering(request: Any, context: Any) -> Any:
        return await behaviour(await first(request, context), context)

    return answering


class InvalidMessagesAreInvalidArgument(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        for kind, streaming_requests in (
            ("unary_unary", False),
            ("unary_stream", False),
            ("stream_unary", True),
            ("stream_stream", True),
        ):
            if (behaviour := getattr(handler, kind)) is not None:
                wrapped = _wrap(behaviour, decode, streaming_requests)
                return handler._replace(request_deserializer=None, **{kind: wrapped})
        return handler
