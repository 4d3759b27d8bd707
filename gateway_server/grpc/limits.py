"""How many gRPC calls the gateway holds at once: at most ``--grpc-max-calls`` in all and
``--grpc-max-calls-per-client`` of one client (:mod:`gateway_server.clients`: the peer's address,
or the metadata ``--client-header`` names). A call past either is refused before its first
message is read, with ``RESOURCE_EXHAUSTED`` naming the flag, counted in
``hangup_gateway_calls_refused_total{listener="grpc",reason}`` (the first of each reason is
logged, the rest only counted).

Every call counts from its handler's start to its end, whatever its service (inference, a
health ``Watch``, reflection), but two: a cancel (short, and what ends the calls that fill the
places: refusing it at the cap would keep them) and a health ``Check`` (answered at once: a
probe must not read a full listener as a dead one).

So a stream, which holds up to ``--grpc-stream-max-requests`` engine requests and
``--grpc-stream-buffer-bytes`` of responses, is a place of a few: one client's streams hold at
most its share of those, and all clients' the total.

A server interceptor that wraps each handler's behaviour (gRPC tells an interceptor the method
and its metadata, not the peer: the behaviour's context has it). What it keeps is a count and a
dict entry per client with calls in flight; a call costs two dict operations.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import grpc

from gateway_server.clients import ClientRule
from gateway_server.grpc.cancel import SERVICE_NAME as CANCELLATION
from gateway_server.grpc.common import metadata_value
from gateway_server.labels import Refusal

log = logging.getLogger("hangup.gateway")

_EXEMPT = (f"/{CANCELLATION}/", "/grpc.health.v1.Health/Check")
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class CallLimits(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Holds the listener's calls to ``total`` and each client's to ``per_client`` (0: no
    bound); ``refused`` is told each refusal's reason."""

    def __init__(
        self, total: int, per_client: int, clients: ClientRule, refused: Callable[[Refusal], None]
    ) -> None:
        self._total = total
        self._per_client = per_client
        self._clients = clients
        self._refused = refused
        self._logged: set[Refusal] = set()
        self.held = 0
        self._held_by: dict[str, int] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_EXEMPT):
            return handler
        for kind in _KINDS:
            if (behaviour := getattr(handler, kind)) is not None:
                return handler._replace(**{kind: self._counted(behaviour)})
        return handler

    def _counted(self, behaviour: Any) -> Any:
        if inspect.isasyncgenfunction(behaviour):

            async def generating(request: Any, context: Any) -> Any:
                client = await self._admit(context)
                try:
                    async for response in behaviour(request, context):
                        yield response
                finally:
                    self._release(client)

            return generating
        if not inspect.iscoroutinefunction(behaviour):
            return behaviour  # run in a thread by grpc: the gateway registers none

        async def answering(request: Any, context: Any) -> Any:
            client = await self._admit(context)
            try:
                return await behaviour(request, context)
            finally:
                self._release(client)

        return answering

    async def _admit(self, context: Any) -> str:
        """Count the call in, or refuse it (``context.abort`` raises)."""
        rule = self._clients
        client = rule.key(context.peer(), lambda key: metadata_value(context, key))
        held = self._held_by.get(client, 0)
        if self._total and self.held >= self._total:
            await self._refuse(
                context,
                Refusal.TOO_MANY_CALLS,
                f"{self.held} gRPC calls are in flight, the most this gateway holds "
                "(--grpc-max-calls); retry when one has ended",
            )
        if self._per_client and held >= self._per_client:
            await self._refuse(
                context,
                Refusal.TOO_MANY_CLIENT_CALLS,
                f"{held} gRPC calls of this client are in flight, the most one client may "
                "hold (--grpc-max-calls-per-client); retry when one has ended",
            )
        self.held += 1
        self._held_by[client] = held + 1
        return client

    def _release(self, client: str) -> None:
        self.held -= 1
        left = self._held_by[client] - 1
        if left:
            self._held_by[client] = left
        else:
            del self._held_by[client]

    async def _refuse(self, context: Any, reason: Refusal, message: str) -> None:
        self._refused(reason)
        if reason not in self._logged:
            self._logged.add(reason)
            fields = {"listener": "grpc", "reason": reason.value}
            log.warning(
                "refused a gRPC call: %s (further ones are only counted)",
                reason.value,
                extra={"fields": fields},
            )
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
