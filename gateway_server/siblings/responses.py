"""Response ids across API processes: a cancel of a response finds its record at its home.

A response's id is ``resp_`` and a fresh call id drawn so that its home
(:func:`~gateway_server.siblings.directory.home_of`) is the process that made it and holds its
record (:meth:`~gateway_server.siblings.directory.SiblingDirectory.fresh_id`). So a
``POST /v1/responses/{id}/cancel`` that lands elsewhere asks that one process, one hop
(:attr:`~gateway_server.siblings.channel.Op.CANCEL_RESPONSE`), and it cancels the record's own
call, as it would for a client of its own. Nothing else is asked or cancelled: a response id
names a response record, never a call.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway_server.errors import GatewayError, RequestNotFound
from gateway_server.siblings.channel import Channel, Message, Op, SiblingUnreachable
from gateway_server.siblings.directory import CANCEL_WAIT, home_of
from gateway_server.siblings.scope import CancelHere
from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.gateway")

PREFIX = "resp_"


class SiblingResponses:
    """The other API processes as homes of response ids (a
    :class:`~gateway_server.siblings.scope.ResponseHomes`); answers theirs with
    ``cancel_here``."""

    def __init__(self, channel: Channel, cancel_here: CancelHere) -> None:
        self._channel = channel
        self._cancel_here = cancel_here
        channel.on_awaited(Op.CANCEL_RESPONSE, self._on_cancel)

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Ask the id's home. Raises RequestNotFound (the home holds none, is this process or
        does not answer) or GatewayError (the home failed the cancel)."""
        home = home_of(response_id.removeprefix(PREFIX), self._channel.count)
        if home == self._channel.slot:
            raise _not_found(response_id)
        try:
            reply = await self._channel.ask(
                home, Op.CANCEL_RESPONSE, {"id": response_id}, CANCEL_WAIT
            )
        except SiblingUnreachable as exc:
            fields = {"response_id": response_id, "home": home, "error": str(exc)}
            log_event(log, "response_home_unreachable", logging.WARNING, **fields)
            raise _not_found(response_id) from exc
        if isinstance(reply.get("response"), dict):
            return dict(reply["response"])
        if reply.get("error") == "not_found":
            raise _not_found(response_id)
        raise GatewayError(f"the API process holding {response_id} failed its cancel")

    async def _on_cancel(self, message: Message) -> Message:
        response_id = message["id"]
        if not isinstance(response_id, str):
            raise TypeError("a response id must be a string")
        try:
            return {"response": await self._cancel_here(response_id)}
        except RequestNotFound:
            return {"error": "not_found"}
        except GatewayError as exc:  # an engine failing its abort
            return {"error": exc.message}


def _not_found(response_id: str) -> RequestNotFound:
    return RequestNotFound(
        f"no response with id {response_id!r} is in flight or stored here", param="response_id"
    )
