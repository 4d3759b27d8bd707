"""The cancel adapter that speaks ``hangup.v1.Cancellation/Cancel`` to the upstream over gRPC.

One attempt per :meth:`GrpcCancelAdapter.cancel`, like every ``CancelAdapter``: the
``Canceller`` retries it with backoff until its deadline. Status mapping:

    OK, state "cancelled"                       → ok
    OK, state "finished"                        → finished
    NOT_FOUND                                   → not_found
    UNAVAILABLE, DEADLINE_EXCEEDED,
    RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
    UNKNOWN                                     → retried (CancelAttemptFailed)
    anything else (UNAUTHENTICATED, INVALID_ARGUMENT, UNIMPLEMENTED, …) → error

The adapter opens a channel of its own (a separate HTTP/2 connection), so a cancel never waits
behind the relayed streams' flow control.
"""

from __future__ import annotations

import logging

import grpc

from hangup_contract.cancel_labels import CancelState, Reason
from hangup_contract.protos import cancellation_pb2
from proxy.errors import CancelAttemptFailed
from proxy.labels import CancelResult
from proxy.upstream.grpc_target import upstream_channel

log = logging.getLogger("hangup.proxy.cancel")

CANCEL_METHOD = "/hangup.v1.Cancellation/Cancel"
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)


class GrpcCancelAdapter:
    """Cancels upstream calls through the upstream's ``hangup.v1.Cancellation`` service."""

    name = "hangup_grpc"
    calls_upstream = True

    def __init__(self, target: str, token: str | None, attempt_timeout: float) -> None:
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = attempt_timeout
        self._channel = upstream_channel(target, [("grpc.use_local_subchannel_pool", 1)])
        self._cancel = self._channel.unary_unary(
            CANCEL_METHOD,
            request_serializer=cancellation_pb2.CancelRequest.SerializeToString,
            response_deserializer=cancellation_pb2.CancelResponse.FromString,
        )

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        request = cancellation_pb2.CancelRequest(request_id=request_id, reason=reason.value)
        try:
            response = await self._cancel(
                request, timeout=self._timeout, metadata=self._metadata, wait_for_ready=False
            )
        except grpc.aio.AioRpcError as exc:
            return self._failed(exc)
        except grpc.aio.UsageError as exc:  # the adapter was closed: the proxy is exiting
            log.warning("cancel %s not sent: %s", request_id, exc)
            return CancelResult.ERROR
        if response.state == CancelState.CANCELLED:
            return CancelResult.OK
        if response.state == CancelState.FINISHED:
            return CancelResult.FINISHED
        log.warning("cancel answered without a known state: %r", response.state)
        return CancelResult.ERROR

    @staticmethod
    def _failed(exc: grpc.aio.AioRpcError) -> CancelResult:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return CancelResult.NOT_FOUND
        if code in _RETRYABLE:
            raise CancelAttemptFailed(f"cancel answered {code.name}: {exc.details()}") from exc
        log.warning("cancel refused with %s: %s", code.name, exc.details())
        return CancelResult.ERROR

    async def close(self) -> None:
        await self._channel.close()
