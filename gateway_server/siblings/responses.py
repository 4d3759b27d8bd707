"""Response ids across API processes: whatever asks for a response finds it at its home.

A response's id is ``resp_`` and a fresh call id drawn so that its home
(:func:`~gateway_server.siblings.directory.home_of`) is the process that made it and holds its
record (:meth:`~gateway_server.siblings.directory.SiblingDirectory.fresh_id`). So a route that
lands elsewhere asks that one process, one hop, over the sibling channel, and it answers as it
would a client of its own:

- ``POST /v1/responses/{id}/cancel``: :attr:`Op.CANCEL_RESPONSE` (the record's own call);
- ``GET /v1/responses/{id}``: :attr:`Op.RESPONSE`; ``DELETE``: :attr:`Op.DELETE_RESPONSE`;
- a ``previous_response_id``: :attr:`Op.RESPONSE_TURNS` (the turns it continues);
- ``GET /v1/responses/{id}?stream=true``: :attr:`Op.RESPONSE_EVENTS`, asked again and again,
  each answer a page of the events after the last one had: those ready, else the next ones
  within :data:`PAGE_WAIT` (at most :data:`PAGE_BYTES` of them, plus one), so a follower on
  another process gets each event as it is made, one question a page.

Every message is bounded as the channel's others: the id (the id rule, checked before it is
asked), an answer of one response object, its turns (which fit the context) or a page, within
the channel's line limit; a question's deadline is the channel's (a page's: its wait more). A
home that does not answer is a 404, as an id that names nothing. Nothing else is asked or
cancelled: a response id names a response record, never a call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway_server.errors import GatewayError, InvalidRequest, RequestNotFound
from gateway_server.siblings.directory import CANCEL_WAIT
from gateway_server.siblings.ops import ASK_WAIT, Op
from gateway_server.siblings.scope import Page, ResponsesHere
from hangup_contract.runtime.logs import log_event
from hangup_contract.runtime.sibling_lines import Message
from hangup_contract.runtime.siblings import Channel, SiblingUnreachable, home_of

log = logging.getLogger("hangup.gateway")

PREFIX = "resp_"
PAGE_WAIT = 2.0
"""Seconds a home waits for a background response's next event before it answers a page with
none (the follower asks again)."""
PAGE_BYTES = 256 * 1024
"""A page's events, in bytes, past which the home answers (plus the one event that crossed)."""


class SiblingResponses:
    """The other API processes as homes of response ids (a
    :class:`~gateway_server.siblings.scope.ResponseHomes`); answers their questions about this
    process's with ``here``."""

    def __init__(self, channel: Channel, here: ResponsesHere) -> None:
        self._channel = channel
        self._here = here
        channel.on_awaited(Op.CANCEL_RESPONSE, self._on_cancel)
        channel.on_awaited(Op.RESPONSE_EVENTS, self._on_page)
        channel.on(Op.RESPONSE, self._on_retrieve)
        channel.on(Op.DELETE_RESPONSE, self._on_delete)
        channel.on(Op.RESPONSE_TURNS, self._on_turns)

    async def cancel(self, response_id: str) -> dict[str, Any]:
        reply = await self._ask(response_id, Op.CANCEL_RESPONSE, {}, CANCEL_WAIT)
        return _object(reply, "response")

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        return _object(await self._ask(response_id, Op.RESPONSE), "response")

    async def delete(self, response_id: str) -> dict[str, Any]:
        return _object(await self._ask(response_id, Op.DELETE_RESPONSE), "response")

    async def turns(self, response_id: str) -> list[dict[str, Any]]:
        turns = (await self._ask(response_id, Op.RESPONSE_TURNS)).get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise GatewayError(f"the API process holding {response_id} answered no turns")
        return turns

    async def page(self, response_id: str, after: int) -> Page:
        reply = await self._ask(
            response_id, Op.RESPONSE_EVENTS, {"after": after}, PAGE_WAIT + ASK_WAIT
        )
        events, last, ended = reply.get("events"), reply.get("last"), reply.get("ended")
        if not isinstance(events, str) or type(last) is not int or not isinstance(ended, bool):
            raise GatewayError(f"the API process holding {response_id} answered no events")
        return Page(events.encode(), last, ended)

    async def _ask(
        self, response_id: str, op: Op, fields: Message | None = None, wait: float = ASK_WAIT
    ) -> Message:
        """Ask the id's home. Raises RequestNotFound (the home holds none, is this process or
        does not answer), or what the home raised (InvalidRequest, GatewayError)."""
        home = home_of(response_id.removeprefix(PREFIX), self._channel.count)
        if home == self._channel.slot:
            raise _not_found(response_id)
        try:
            reply = await self._channel.ask(home, op, {"id": response_id, **(fields or {})}, wait)
        except SiblingUnreachable as exc:
            fields = {"response_id": response_id, "home": home, "op": op.value, "error": str(exc)}
            log_event(log, "response_home_unreachable", logging.WARNING, **fields)
            raise _not_found(response_id) from exc
        if "error" in reply:
            raise _error(reply, response_id)
        return reply

    def _on_retrieve(self, message: Message) -> Message:
        response_id = _id(message)
        return _answered(lambda: {"response": self._here.retrieve_here(response_id)})

    def _on_delete(self, message: Message) -> Message:
        response_id = _id(message)
        return _answered(lambda: {"response": self._here.delete_here(response_id)})

    def _on_turns(self, message: Message) -> Message:
        response_id = _id(message)
        return _answered(lambda: {"turns": self._here.turns_here(response_id)})

    async def _on_cancel(self, message: Message) -> Message:
        try:
            return {"response": await self._here.cancel_here(_id(message))}
        except GatewayError as exc:  # none held here, or an engine failing its abort
            return _failure(exc)

    async def _on_page(self, message: Message) -> Message:
        after = message["after"]
        if type(after) is not int:
            raise TypeError("'after' must be an integer")
        try:
            page = await self._here.page_here(_id(message), after)
        except GatewayError as exc:
            return _failure(exc)
        return {"events": page.events.decode(), "last": page.last, "ended": page.ended}


def _id(message: Message) -> str:
    response_id = message["id"]
    if not isinstance(response_id, str):
        raise TypeError("a response id must be a string")
    return response_id


def _answered(answer: Callable[[], Message]) -> Message:
    """``answer()``, or the error it raised as an answer."""
    try:
        return dict(answer())
    except GatewayError as exc:
        return _failure(exc)


def _failure(exc: GatewayError) -> Message:
    kind = (
        "not_found"
        if isinstance(exc, RequestNotFound)
        else "invalid"
        if isinstance(exc, InvalidRequest)
        else "failed"
    )
    return {"error": kind, "message": exc.message, "param": exc.param}


def _error(reply: Message, response_id: str) -> GatewayError:
    """The error a home answered, raised here as it was there."""
    message, param = reply.get("message"), reply.get("param")
    if not isinstance(message, str):
        message = f"the API process holding {response_id} failed: {reply.get('error')}"
    param = param if isinstance(param, str) else None
    if reply["error"] == "not_found":
        return RequestNotFound(message, param=param)
    if reply["error"] == "invalid":
        return InvalidRequest(message, param=param)
    return GatewayError(message, param=param)


def _object(reply: Message, key: str) -> dict[str, Any]:
    value = reply.get(key)
    if not isinstance(value, dict):
        raise GatewayError(f"the API process answered no {key}")
    return value


def _not_found(response_id: str) -> RequestNotFound:
    shown = response_id if len(response_id) <= 200 else response_id[:200] + "..."
    return RequestNotFound(
        f"no response with id {shown!r} is in flight or stored here", param="response_id"
    )
