"""Request plumbing shared by the HTTP APIs: request ids, JSON bodies, typed fields."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway_server.errors import BodyTimeout, InvalidRequest, RequestTooLarge
from gateway_server.labels import Protocol
from gateway_server.requests import json_object
from gateway_server.service import GenerationService
from hangup_contract import jobs
from hangup_contract import request_id as request_ids
from hangup_contract.runtime.connections import BodyStalled, body_chunks

REQUEST_ID_HEADER = request_ids.HEADER

SERVICE = web.AppKey("service", GenerationService)
CANCEL_TOKEN = web.AppKey("cancel_token", str)
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
BODY_TIMEOUT = web.AppKey("body_timeout", float)
MAX_BATCH_IDS = web.AppKey("max_batch_ids", int)
# What the error middleware needs to count a refused generation request.
PROTOCOL = web.RequestKey("protocol", Protocol)
MODEL = web.RequestKey("model", str)


def client_of(request: web.Request) -> str:
    """Who sent ``request``, for fair shares (:mod:`gateway_server.clients`)."""
    return request.app[SERVICE].clients.key(request.remote, request.headers.get)


def request_id(request: web.Request) -> str:
    """The caller's ``X-Request-Id``, or a fresh 128-bit random id (the service's: with API
    processes, one whose home is this process). Raises InvalidRequest for one that breaks the
    contract's rule."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return request.app[SERVICE].fresh_call_id()
    if not request_ids.is_valid(given):
        raise InvalidRequest(f"{REQUEST_ID_HEADER} must be {request_ids.RULE}")
    return given


def group_of(request: web.Request, body: dict[str, Any] | None = None) -> str | None:
    """The call's group (``hangup_contract.jobs``): its ``X-Hangup-Group`` header, or its
    body's ``metadata.hangup_group`` (an OpenAI body), or both the same. Raises InvalidRequest
    for one that breaks the id rule, or two that differ."""
    try:
        header = jobs.check_group(request.headers.get(jobs.GROUP_HEADER))
        return jobs.one_group(header, None if body is None else jobs.body_group(body))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="metadata") from exc


async def read_body(request: web.Request) -> bytes:
    """The whole body. Raises RequestTooLarge past the limit (a body declared larger is refused
    before a byte of it is read) or BodyTimeout when it stalls for ``--body-timeout``."""
    limit = request.app[MAX_BODY_BYTES]
    if request.content_length is not None and request.content_length > limit:
        raise RequestTooLarge(
            f"request body of {request.content_length} bytes is larger than the limit of "
            f"{limit} bytes"
        )
    chunks, size = [], 0
    try:
        async for chunk in body_chunks(request, request.app[BODY_TIMEOUT]):
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"request body is larger than the limit of {limit} bytes")
            chunks.append(chunk)
    except BodyStalled as exc:
        raise BodyTimeout(str(exc)) from exc
    return b"".join(chunks)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object. Raises RequestTooLarge, BodyTimeout or InvalidRequest naming
    the problem (``gateway_server.requests.json_object``: malformed, nested too deeply, a number
    too long, or no object)."""
    raw = await read_body(request)
    if not raw:
        raise InvalidRequest("request body must be a JSON object")
    return json_object(raw, "request body")
