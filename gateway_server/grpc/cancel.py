"""``hangup.v1.Cancellation/Cancel``: the cancel contract over gRPC (``hangup_contract``).

Same behaviour as ``POST /v2/requests/{id}/cancel``: cancels a running call (or one aliased
request of a stream), saying what it used (``usage``), answers ``finished`` for one that
already ended, ``NOT_FOUND`` for an id
never seen (leaving a tombstone, so a request still on its way is rejected when it arrives). An
id that breaks the cancel rule (``hangup_contract.request_id.is_cancel_id``) is
``INVALID_ARGUMENT``, before it is looked up.
With a cancel token, the metadata ``authorization: Bearer <token>`` is required
(``UNAUTHENTICATED`` otherwise). An unknown reason is ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from typing import Any

import grpc

from gateway_server.errors import GatewayError, InvalidRequest, RequestNotFound
from gateway_server.grpc.common import check_token, status_of
from gateway_server.service import GenerationService
from hangup_contract import jobs
from hangup_contract import request_id as request_ids
from hangup_contract.cancel import CancelAnswer
from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import CancelKind
from hangup_contract.protos import cancellation_pb2 as pb

SERVICE_NAME = "hangup.v1.Cancellation"


class CancellationServicer:
    def __init__(self, service: GenerationService, token: str | None) -> None:
        self._service = service
        self._token = token

    async def cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        try:
            check_token(context, self._token)
            if not request.request_id:
                raise InvalidRequest("request_id is required")
            if not request_ids.is_cancel_id(request.request_id):
                raise InvalidRequest(f"request_id must be {request_ids.CANCEL_RULE}")
            try:
                reason = Reason.parse(request.reason or None)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="reason") from exc
            result = await self._counted(request.request_id, reason)
        except GatewayError as exc:
            await context.abort(status_of(exc), exc.message)
            raise AssertionError("context.abort returns by raising") from exc
        usage = pb.Usage(**result.usage.to_json()) if result.usage is not None else None
        return pb.CancelResponse(
            request_id=result.request_id,
            state=result.state.value,
            phase=result.phase.value if result.phase is not None else "",
            generated_tokens=result.generated_tokens,
            usage=usage,
        )

    async def _counted(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The service's cancel, counted as one call of the cancel API (a single id)."""
        metrics = self._service.metrics
        try:
            answer = await self._service.cancel(request_id, reason)
        except RequestNotFound:
            metrics.cancel_answered(CancelKind.SINGLE, [jobs.NOT_FOUND])
            raise
        metrics.cancel_answered(CancelKind.SINGLE, [answer.state.value])
        return answer


def cancellation_handler(servicer: CancellationServicer) -> grpc.GenericRpcHandler:
    method = grpc.unary_unary_rpc_method_handler(
        servicer.cancel,
        request_deserializer=pb.CancelRequest.FromString,
        response_serializer=pb.CancelResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Cancel": method})
