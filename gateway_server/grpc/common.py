"""What every gRPC handler of the gateway shares: status codes for the gateway's errors, the call
id, why a handler was cancelled, the cancel token, and running generation so that a hang-up
reaches the engine with the right reason.

Status codes (the gRPC face of :mod:`gateway_server.errors`)::

    InvalidRequest, RequestTooLarge   INVALID_ARGUMENT
    Unauthorized                      UNAUTHENTICATED
    ModelNotFound, RequestNotFound    NOT_FOUND
    DuplicateRequestId                ALREADY_EXISTS
    CancelledBeforeArrival            CANCELLED
    RequestCancelled                  CANCELLED
    Unavailable                       UNAVAILABLE
    EngineFailure, other              INTERNAL
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from gateway_server.errors import (
    CancelledBeforeArrival,
    ClientError,
    DuplicateRequestId,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NotImplementedForModel,
    RequestNotFound,
    RequestTooLarge,
    Unauthorized,
    Unavailable,
)
from gateway_server.registry import Call
from gateway_server.service import GenerationService
from hangup_contract import jobs
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import bearer_matches
from hangup_contract.cancel_labels import Reason

REQUEST_ID_KEY = request_ids.METADATA_KEY
_CODES: tuple[tuple[type[GatewayError] | tuple[type[GatewayError], ...], grpc.StatusCode], ...] = (
    ((InvalidRequest, RequestTooLarge), grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthorized, grpc.StatusCode.UNAUTHENTICATED),
    ((ModelNotFound, RequestNotFound), grpc.StatusCode.NOT_FOUND),
    (DuplicateRequestId, grpc.StatusCode.ALREADY_EXISTS),
    (CancelledBeforeArrival, grpc.StatusCode.CANCELLED),
    (ClientError, grpc.StatusCode.INVALID_ARGUMENT),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (NotImplementedForModel, grpc.StatusCode.UNIMPLEMENTED),
)

T = TypeVar("T")
M = TypeVar("M", bound=Message)


def parse(message_type: type[M], raw: bytes) -> M:
    """``raw`` parsed as a ``message_type``. Raises InvalidRequest when it is not one."""
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        name = message_type.DESCRIPTOR.full_name
        raise InvalidRequest(f"the message is not a valid {name}") from exc


def status_of(exc: GatewayError) -> grpc.StatusCode:
    for kinds, code in _CODES:
        if isinstance(exc, kinds):
            return code
    return grpc.StatusCode.INTERNAL


def refused(exc: GatewayError) -> bool:
    """True for errors that refuse a request before it runs (counted ``outcome="rejected"``)."""
    return isinstance(exc, ClientError | Unavailable) and not isinstance(
        exc, CancelledBeforeArrival
    )


def metadata_value(context: Any, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key and isinstance(value, str):
            return value
    return None


def client_of(context: Any, service: GenerationService) -> str:
    """Who made the call, for fair shares (:mod:`gateway_server.clients`)."""
    return service.clients.key(context.peer(), lambda key: metadata_value(context, key))


def call_id(context: Any, fresh: Callable[[], str]) -> str:
    """The caller's ``x-request-id``, or ``fresh()``. Raises InvalidRequest for a malformed id."""
    given = metadata_value(context, REQUEST_ID_KEY)
    if given is None:
        return fresh()
    if not request_ids.is_valid(given):
        raise InvalidRequest(f"{REQUEST_ID_KEY} must be {request_ids.RULE}")
    return given


def group_of(context: Any) -> str | None:
    """The call's group, its ``x-hangup-group`` metadata (``hangup_contract.jobs``). Raises
    InvalidRequest for one that breaks the id rule."""
    try:
        return jobs.check_group(metadata_value(context, jobs.GROUP_METADATA_KEY))
    except ValueError as exc:
        raise InvalidRequest(f"{jobs.GROUP_METADATA_KEY}: {exc}") from exc


def check_token(context: Any, token: str | None) -> None:
    """Raise Unauthorized unless the metadata carries ``authorization: Bearer <token>``."""
    if token is None:
        return
    if not bearer_matches(metadata_value(context, "authorization"), token):
        raise Unauthorized("the cancel API needs metadata 'authorization: Bearer <token>'")


def hangup_reason(context: Any) -> Reason:
    """Why gRPC cancelled a handler: its deadline passed, or the client cancelled or left.

    (A client that left and one that cancelled look the same to a gRPC server; in front of the
    gateway, the proxy's explicit cancel names the difference and arrives first.)
    """
    remaining = context.time_remaining()
    # A proxy in front passes the same deadline on and may reset the stream a moment before
    # this server's own timer fires: that is the deadline too.
    if remaining is not None and remaining <= 0.05:
        return Reason.DEADLINE_EXCEEDED
    return Reason.GRPC_CANCELLED


async def generate_guarded(call: Call, context: Any, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` (which generates for ``call``) so that a hang-up aborts it with its reason.

    gRPC cancels the handler task when the client cancels, leaves or runs out of time. The
    work runs in a task of its own, so the handler can record *why* on the call before the
    cancellation reaches the engine request (which aborts with ``call.hangup_reason``).
    """
    task = asyncio.create_task(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        call.hangup_reason = hangup_reason(context)
        task.cancel()
        # Whatever the work ends with now, the client is gone: the cancellation goes on.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
