"""The gRPC listener: relays every method to the upstream as raw messages, and turns a client that
hangs up into an explicit cancel call.

How one call goes::

    client ──▶ generic handler (any method, bytes in / bytes out; no schema)
                 │  admit (limits, draining) · pick the upstream call id (x-request-id)
                 ▼
               upstream stream-stream call, same method, client metadata, remaining deadline
                 │  requests pumped client → upstream in a task of their own
                 │  initial metadata, messages, trailers and status relayed upstream → client
                 ▼
    hang-up:   the handler is cancelled ──▶ why? deadline passed → deadline_exceeded;
               client's TCP connection gone → client_disconnect (see grpc_peer);
               otherwise the client cancelled → grpc_cancelled
                 ▼
               proxy.calls.lifecycle, as for HTTP: explicit cancel call (by id, with the reason)
               submitted to the Canceller; the upstream stream stays open until the cancel
               is acknowledged or ``--stream-close-grace`` passes, then it is cancelled too.

Every gRPC method has the same shape on the wire (length-prefixed messages on one HTTP/2
stream), so relaying each call as stream-stream serves unary and streaming methods alike. The
explicit cancel goes out *before* the upstream stream is closed so the upstream records the real
reason, not the "stream reset" it would infer from the closed stream.

The proxy ends a call itself with its own reason (``shutdown`` when draining ends,
``proxy_timeout`` past ``--max-request-duration``); the client then gets ``UNAVAILABLE`` or
``DEADLINE_EXCEEDED``. Calls refused on arrival get ``UNAVAILABLE`` (draining),
``RESOURCE_EXHAUSTED`` (``--max-concurrent-streams``), ``INVALID_ARGUMENT`` (a trusted but
malformed ``x-request-id``) or ``ALREADY_EXISTS`` (a trusted one another call holds: its
hang-up's cancel would name that call; ``proxy.calls.held``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import GROUP_METADATA_KEY
from hangup_contract.runtime.connections import grpc_server_options
from hangup_contract.usage import usage_in_metadata
from proxy.calls.admin_paths import Refusal
from proxy.calls.groups import checked_group
from proxy.calls.lifecycle import CallEnding, log_call
from proxy.calls.request_ids import RequestIds, choose_request_ids
from proxy.calls.state import Call, ServerState
from proxy.errors import (
    BadGroup,
    BadRequestId,
    CancelledById,
    ClientGone,
    DuplicateRequestId,
    Overloaded,
    ProxyError,
    TooManyGroupCalls,
    WorkerSilent,
)
from proxy.grpc.metadata import (
    Metadata,
    client_metadata,
    peer_address,
    relayable,
    upstream_metadata,
)
from proxy.grpc.peer import Liveness, PeerWatch, can_tell_disconnects
from proxy.grpc.status import StatusWatch
from proxy.labels import CallProtocol, Outcome, Stage
from proxy.upstream.grpc_target import upstream_channel

log = logging.getLogger("hangup.proxy.grpc")

_UNLIMITED_MESSAGES = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
# The upstream call carries the client's deadline as it stood when the call started upstream, so
# it fires a hair before the client's own: a call ending this close to its deadline ended by it.
_DEADLINE_SLACK = 0.1
_LOCAL_ENDINGS = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
_PROXY_STOPPED = {
    Reason.SHUTDOWN: (grpc.StatusCode.UNAVAILABLE, "the proxy is shutting down"),
    Reason.PROXY_TIMEOUT: (grpc.StatusCode.DEADLINE_EXCEEDED, "proxy timeout"),
    # A cancel by id on the proxy's own API (proxy.http.cancel_api): as the gateway ends one.
    Reason.EXPLICIT: (grpc.StatusCode.CANCELLED, "request cancelled (explicit)"),
}


def _group(metadata: Metadata) -> str | None:
    """The call's ``x-hangup-group`` (the first), checked; raises ``BadGroup``."""
    value = next((v for k, v in metadata if k == GROUP_METADATA_KEY), None)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadGroup(f"{GROUP_METADATA_KEY} must be text")
    return checked_group(value)


class _Exchange:
    """One relayed call: pumps requests up, relays responses, trailers and status down."""

    def __init__(
        self, upstream: grpc.aio.StreamStreamCall, context: Any, call: Call, state: ServerState
    ) -> None:
        self.upstream = upstream
        self._context = context
        self._call = call
        self._state = state
        self.ended = False  # the upstream finished the call (nothing left to cancel there)
        self.unreachable = False  # it failed UNAVAILABLE before relaying a thing
        self._pump_task: asyncio.Task[None] | None = None
        self._status = StatusWatch(upstream)

    async def run(self, requests: AsyncIterator[bytes]) -> grpc.StatusCode:
        """Relay until the upstream's status; the request pump keeps going until ``close``."""
        self._pump_task = asyncio.create_task(self._pump(requests))
        return await self._relay_responses()

    async def close(self) -> None:
        """Stop pumping requests (call once the upstream call is finished or cancelled: a
        pump stopped inside an upstream write would cancel the upstream call itself)."""
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task

    async def _pump(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for message in requests:
                self._call.bytes_in += len(message)
                await self.upstream.write(message)
            await self.upstream.done_writing()
        except Exception as exc:
            # Either side ended the call first (the upstream with a status that reaches the
            # client through the response side, or the client by leaving).
            log.debug("request pump stopped: %s: %s", type(exc).__name__, exc)

    async def _relay_responses(self) -> grpc.StatusCode:
        sent = time.monotonic()
        try:
            initial = await self.upstream.initial_metadata()
            self._first_byte(sent)
            await self._to_client(
                self._context.send_initial_metadata(
                    client_metadata(initial or (), self._call.request_id or "")
                )
            )
            while (message := await self.upstream.read()) is not grpc.aio.EOF:
                self._call.stage = Stage.STREAMING
                self._call.bytes_out += len(message)
                self._call.chunks_out += 1
                await self._to_client(self._context.write(message))
            code = await self.upstream.code()
            details = await self.upstream.details()
            trailing = await self.upstream.trailing_metadata()
            code, details, trailing = await self._status.status(code, details, trailing)
        except grpc.aio.AioRpcError as exc:
            code, details, trailing = await self._status.status(
                exc.code(), exc.details(), exc.trailing_metadata()
            )
            self.unreachable = code == grpc.StatusCode.UNAVAILABLE and not self._call.bytes_out
        # DEADLINE_EXCEEDED and CANCELLED may be made up locally by gRPC while the upstream is
        # still working: such a call still gets its explicit cancel.
        self.ended = code not in _LOCAL_ENDINGS
        self._call.status = code.value[0]  # the gRPC status number, in the call's log line
        if code == grpc.StatusCode.CANCELLED:  # what the server says it used, if it says
            self._call.usage = usage_in_metadata(trailing or ())
        self._context.set_trailing_metadata(relayable(trailing or ()))
        if code != grpc.StatusCode.OK:
            self._context.set_code(code)
            self._context.set_details(details or "")
        return code

    @staticmethod
    async def _to_client(sending: Awaitable[None]) -> None:
        """Send to the client; raises ClientGone when its call or connection is gone."""
        try:
            await sending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ClientGone(f"{type(exc).__name__}: {exc}") from exc

    def _first_byte(self, sent: float) -> None:
        if self._call.upstream_ttfb is None:
            self._call.upstream_ttfb = time.monotonic() - sent
            self._state.metrics.first_byte(self._call.upstream_ttfb)


class GrpcRelay:
    """The gRPC listener (``name``, ``start``, ``stop_accepting``, ``close``, as every listener of
    ``proxy.server``), built from the shared ``ServerState``. Calls are stopped through
    ``Call.stop`` when the server drains (see ``proxy.calls.state``)."""

    name = "grpc"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._config = state.config
        self._submit = state.canceller.submitter(CallProtocol.GRPC)
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._port = 0
        self._peers = PeerWatch()
        self._guard = state.config.admin_guard()

    @property
    def port(self) -> int:
        """The bound port (after ``start``)."""
        return self._port

    async def start(self) -> str:
        """Bind and serve; returns ``host:port``. Raises ``OSError`` when it cannot bind."""
        config = self._config
        self._channel = upstream_channel(config.upstream_grpc, _UNLIMITED_MESSAGES)
        limit = config.max_body_size
        # gRPC itself refuses a larger request message with RESOURCE_EXHAUSTED.
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", -1 if limit is None else limit),
                ("grpc.max_send_message_length", -1),
                *grpc_server_options(config.connection_limits),
            ]
        )
        server.add_generic_rpc_handlers([_RelayHandler(self._handle)])
        self._port = server.add_insecure_port(f"{config.host}:{config.grpc_port}")
        if self._port == 0:
            raise OSError(f"cannot bind the gRPC listener to {config.host}:{config.grpc_port}")
        await server.start()
        self._server = server
        if not can_tell_disconnects():
            log.warning(
                "sock_diag is unavailable: gRPC clients that vanish count as grpc_cancelled"
            )
        return f"{config.host}:{self._port}"

    async def stop_accepting(self) -> None:
        """New calls are refused through the shared draining flag; nothing else to do here."""

    async def close(self) -> None:
        """Stop serving: calls still running are cancelled by gRPC (the drain came first)."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _handle(self, method: str, requests: AsyncIterator[bytes], context: Any) -> None:
        refused = self._guard.grpc(method)
        if refused is not None:
            self._refuse_admin(method, context, refused)
            return
        call = Call(CallProtocol.GRPC, "POST", method, context.peer())
        ending = CallEnding(
            call,
            self._state.metrics,
            self._submit,
            close_grace=self._config.stream_close_grace,
            gone_status=grpc.StatusCode.CANCELLED.value[0],
            log=log_call,
        )
        metadata = tuple(context.invocation_metadata() or ())
        try:
            ids = choose_request_ids(
                [(k, v) for k, v in metadata if isinstance(v, str)],
                trust_client=self._config.trust_client_request_id,
            )
            if self._state.held is not None:  # held by its group too (proxy.calls.groups)
                call.group = _group(metadata)
                call.streaming = "Stream" in method
            self._state.admit(call)
        except (BadRequestId, BadGroup, Overloaded) as exc:
            self._refuse(call, context, exc)
            ending.finish()
            return
        call.request_id, call.client_request_id = ids.upstream, ids.client
        call.task = asyncio.current_task()
        state = self._state
        try:
            # Held for the proxy's own cancel by id, which ends it as the proxy's own stops do
            # (shutdown, --max-request-duration): the lifecycle's cancel, then CANCELLED.
            try:
                if state.held is not None and state.hold(call, call.stop):
                    await state.hold_everywhere(call)  # --workers: a trusted id, free everywhere?
            except (CancelledById, DuplicateRequestId, TooManyGroupCalls, WorkerSilent) as exc:
                self._refuse(call, context, exc)
                return
            await self._relay(ending, method, metadata, ids, requests, context)
        finally:
            ending.finish()  # counted before released: a flush when idle has it (proxy.metrics)
            self._state.release(call)

    def _refuse_admin(self, method: str, context: Any, refusal: Refusal) -> None:
        """``PERMISSION_DENIED`` for an admin method of the server behind, naming its rule;
        outside the call accounting: counted, and logged once."""
        self._state.metrics.admin_refused(CallProtocol.GRPC, refusal.rule.name)
        log.warning(
            "refused an admin route: %s",
            refusal.rule.name,
            extra={"fields": {"path": method[:200], "remote": context.peer()}},
        )
        context.set_code(grpc.StatusCode.PERMISSION_DENIED)
        context.set_details(refusal.message(method))

    def _refuse(self, call: Call, context: Any, exc: ProxyError) -> None:
        if isinstance(exc, BadRequestId | BadGroup):
            code = grpc.StatusCode.INVALID_ARGUMENT
        elif isinstance(exc, CancelledById):
            code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, DuplicateRequestId):
            code = grpc.StatusCode.ALREADY_EXISTS
        elif self._state.draining or isinstance(exc, WorkerSilent):
            code = grpc.StatusCode.UNAVAILABLE
        else:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
        call.outcome, call.error, call.status = exc.outcome, exc.message, code.value[0]
        context.set_code(code)
        context.set_details(exc.message)

    async def _relay(
        self,
        ending: CallEnding,
        method: str,
        metadata: Metadata,
        ids: RequestIds,
        requests: AsyncIterator[bytes],
        context: Any,
    ) -> None:
        assert self._channel is not None
        upstream = self._channel.stream_stream(method)(
            metadata=upstream_metadata(metadata, ids, peer_address(context.peer())),
            timeout=context.time_remaining(),
        )
        ending.upstream_open = True
        exchange = _Exchange(upstream, context, ending.call, self._state)
        # The exchange runs in a task of its own: gRPC cancels a client call whose awaiting task
        # is cancelled, and the upstream call must outlive the handler's cancellation until the
        # explicit cancel has gone out.
        relaying = asyncio.create_task(exchange.run(requests))
        try:
            await self._await_exchange(ending, exchange, relaying, context)
        finally:
            # Whatever happened, no upstream call outlives its client call.
            if not exchange.upstream.done():
                exchange.upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, ClientGone):
                await relaying
            await exchange.close()

    async def _await_exchange(
        self,
        ending: CallEnding,
        exchange: _Exchange,
        relaying: asyncio.Task[grpc.StatusCode],
        context: Any,
    ) -> None:
        call = ending.call
        try:
            async with asyncio.timeout(self._config.max_request_duration):
                code = await asyncio.shield(relaying)
        except TimeoutError:
            await self._hung_up(ending, exchange, relaying, Reason.PROXY_TIMEOUT)
            self._tell_client(context, call, Reason.PROXY_TIMEOUT)
            return
        except ClientGone as exc:
            call.error = str(exc)
            await self._hung_up(ending, exchange, relaying, await self._why(context, gone=True))
            return
        except asyncio.CancelledError:
            stopped_by = call.reason  # set when the proxy itself ended the call
            await self._hung_up(ending, exchange, relaying, stopped_by or await self._why(context))
            if stopped_by is None:
                raise
            # The client gets a status, not a reset.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self._tell_client(context, call, stopped_by)
            return
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and self._deadline_passed(context):
            # The upstream call's copy of the client's deadline fired first: the same hang-up.
            await self._hung_up(ending, exchange, relaying, Reason.DEADLINE_EXCEEDED)
        elif exchange.unreachable:
            call.outcome, call.error = Outcome.UPSTREAM_ERROR, "upstream unavailable"
        else:
            call.outcome = Outcome.COMPLETED

    @staticmethod
    def _deadline_passed(context: Any) -> bool:
        remaining = context.time_remaining()
        return remaining is not None and remaining <= _DEADLINE_SLACK

    async def _why(self, context: Any, *, gone: bool = False) -> Reason:
        """Why the client's call ended: its deadline, a vanished client, or a client cancel.

        ``gone``: sending to the client failed, which without a live connection means the
        client vanished too. The kernel query runs on a worker thread: it walks the host's
        whole table of TCP connections (milliseconds on a large host), and the event loop
        keeps relaying the other calls meanwhile.
        """
        if self._deadline_passed(context):
            return Reason.DEADLINE_EXCEEDED
        liveness = await asyncio.to_thread(self._peers.liveness, context.peer(), self._port)
        if liveness is Liveness.GONE or (gone and liveness is Liveness.UNKNOWN):
            return Reason.CLIENT_DISCONNECT
        return Reason.GRPC_CANCELLED

    @staticmethod
    def _tell_client(context: Any, call: Call, reason: Reason) -> None:
        code, details = _PROXY_STOPPED[reason]
        call.status = code.value[0]
        context.set_code(code)
        context.set_details(details)

    @staticmethod
    async def _hung_up(
        ending: CallEnding,
        exchange: _Exchange,
        relaying: asyncio.Task[grpc.StatusCode],
        reason: Reason,
    ) -> None:
        """The call ends for ``reason``: the lifecycle's sequence, then wait for the exchange.

        Returns once the upstream stream is closed (its cancel answered, or the grace passed)
        and the exchange has ended; the cancel call may still be retrying (the ``Canceller``
        owns it).
        """
        ending.upstream_done = exchange.ended
        ending.stop(reason)
        ending.close_upstream(exchange.upstream.cancel)
        await ending.upstream_closed()
        # The exchange's own end (a client gone mid-send is ClientGone) is this hang-up's: it is
        # not raised to gRPC, which would log it and fail to send a status to the gone client.
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, ClientGone):
            await relaying


class _RelayHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers every method with a raw-bytes stream-stream handler bound to its method name."""

    def __init__(self, handle: Callable[[str, AsyncIterator[bytes], Any], Awaitable[None]]) -> None:
        self._handle = handle

    def service(self, handler_call_details: Any) -> Any:
        method: str = handler_call_details.method

        async def behaviour(requests: AsyncIterator[bytes], context: Any) -> None:
            await self._handle(method, requests, context)

        # No (de)serializers: messages stay bytes end to end.
        return grpc.stream_stream_rpc_method_handler(behaviour)
