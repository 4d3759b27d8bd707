"""``inference.GRPCInferenceService``: KServe v2 over gRPC with Triton's additions.

Health and metadata answer from the service's state. ``ModelInfer`` runs one engine request and
answers once with the whole text; ``ModelStreamInfer`` is Triton's decoupled streaming (see
:mod:`gateway_server.grpc.stream`). Every generation call is one gateway call whose id is the
``x-request-id`` metadata (a fresh one when absent), echoed in the initial metadata.

Errors are the gateway's exceptions mapped to status codes (:mod:`gateway_server.grpc.common`);
refused generation requests count as ``outcome="rejected"``. A call cancelled while it ran ends
``CANCELLED`` with the trailing metadata ``hangup-usage``: what it consumed up to the cancel, as
JSON in OpenAI's usage shape (``{"prompt_tokens", "completion_tokens", "total_tokens"}``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import grpc

from gateway_server import __version__
from gateway_server.engine.base import SamplingParams
from gateway_server.errors import GatewayError, RequestCancelled
from gateway_server.grpc.common import (
    REQUEST_ID_KEY,
    call_id,
    client_of,
    generate_guarded,
    group_of,
    hangup_reason,
    parse,
    refused,
    status_of,
)
from gateway_server.grpc.stream import MODEL_VERSION, StreamLimits, StreamSession, prepare
from gateway_server.grpc.tensors import TextRequest, text_response
from gateway_server.labels import Protocol
from gateway_server.registry import Call
from gateway_server.requests import cancelled_message
from gateway_server.service import GenerationService
from hangup_contract.protos import inference_pb2 as pb
from hangup_contract.usage import metadata as usage_metadata

SERVICE_NAME = "inference.GRPCInferenceService"
_INPUTS = (
    ("text_input", "BYTES", pb.TYPE_STRING, False),
    ("stream", "BOOL", pb.TYPE_BOOL, True),
    ("sampling_parameters", "BYTES", pb.TYPE_STRING, True),
    ("exclude_input_in_output", "BOOL", pb.TYPE_BOOL, True),
)

R = TypeVar("R")
Handler = Callable[..., Awaitable[R]]


def _statuses(generation: bool, request_type: Any = None) -> Callable[[Handler[R]], Handler[R]]:
    """Turn the gateway's exceptions raised by a handler into gRPC statuses; with
    ``request_type``, parse the raw request first (a malformed one is INVALID_ARGUMENT)."""

    def wrap(handler: Handler[R]) -> Handler[R]:
        @functools.wraps(handler)
        async def run(self: InferenceServicer, request: Any, context: Any) -> R:
            try:
                if request_type is not None:
                    request = parse(request_type, request)
                return await handler(self, request, context)
            except GatewayError as exc:
                if generation and refused(exc):
                    self.service.record_rejected(
                        getattr(request, "model_name", None), Protocol.KSERVE_GRPC
                    )
                await context.abort(status_of(exc), exc.message)
                raise AssertionError("context.abort returns by raising") from exc
            except RequestCancelled as exc:
                usage = usage_metadata(exc.usage)
                await context.abort(grpc.StatusCode.CANCELLED, cancelled_message(exc.reason), usage)
                raise AssertionError("context.abort returns by raising") from exc

        return run

    return wrap


class InferenceServicer:
    def __init__(self, service: GenerationService, limits: StreamLimits | None = None) -> None:
        self.service = service
        self.limits = limits or StreamLimits()

    @_statuses(generation=False, request_type=pb.ServerLiveRequest)
    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.service.liveness() is None)

    @_statuses(generation=False, request_type=pb.ServerReadyRequest)
    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.service.ready)

    @_statuses(generation=False, request_type=pb.ModelReadyRequest)
    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> Any:
        """Ready or not, as Triton answers it: a model it does not serve is not ready (OK)."""
        known = request.name == self.service.model.name and request.version in ("", MODEL_VERSION)
        return pb.ModelReadyResponse(ready=known and self.service.ready)

    @_statuses(generation=False, request_type=pb.RepositoryIndexRequest)
    async def repository_index(self, request: pb.RepositoryIndexRequest, context: Any) -> Any:
        """The one model, as Triton lists its repository (``ready``: only if it is ready)."""
        state = "READY" if self.service.ready else "UNAVAILABLE"
        if request.ready and state != "READY":
            return pb.RepositoryIndexResponse()
        index = pb.RepositoryIndexResponse.ModelIndex
        name = self.service.model.name
        return pb.RepositoryIndexResponse(
            models=[index(name=name, version=MODEL_VERSION, state=state)]
        )

    @_statuses(generation=False, request_type=pb.ServerMetadataRequest)
    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name="hangup", version=__version__, extensions=["hangup_cancel", "sequence"]
        )

    @_statuses(generation=False, request_type=pb.ModelMetadataRequest)
    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        self.service.check_model(request.name)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.service.model.name,
            versions=[MODEL_VERSION],
            platform="hangup",
            inputs=[tensor(name=n, datatype=t, shape=[1]) for n, t, _, _ in _INPUTS],
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[-1])],
        )

    @_statuses(generation=False, request_type=pb.ModelConfigRequest)
    async def model_config(self, request: pb.ModelConfigRequest, context: Any) -> Any:
        self.service.check_model(request.name)
        config = pb.ModelConfig(
            name=self.service.model.name,
            backend="hangup",
            max_batch_size=0,
            input=[
                pb.ModelInput(name=n, data_type=d, dims=[1], optional=o) for n, _, d, o in _INPUTS
            ],
            output=[pb.ModelOutput(name="text_output", data_type=pb.TYPE_STRING, dims=[-1])],
            model_transaction_policy=pb.ModelTransactionPolicy(decoupled=True),
        )
        return pb.ModelConfigResponse(config=config)

    @_statuses(generation=True, request_type=pb.ModelInferRequest)
    async def model_infer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        call_name = call_id(context, self.service.fresh_call_id)
        text, params = prepare(self.service, request)
        client, group = client_of(context, self.service), group_of(context)
        async with self.service.call(
            call_name, request.model_name, Protocol.KSERVE_GRPC, client, group
        ) as call:
            whole = await generate_guarded(call, context, self._complete(call, text, params))
        await context.send_initial_metadata(((REQUEST_ID_KEY, call_name),))
        return text_response(request.model_name, MODEL_VERSION, request.id, whole, {})

    async def _complete(self, call: Call, text: TextRequest, params: SamplingParams) -> str:
        whole = "" if text.exclude_input_in_output else text.prompt
        async with aclosing(self.service.generate(call, text.prompt, params)) as chunks:
            async for chunk in chunks:
                whole += chunk.text
        return whole

    @_statuses(generation=True)
    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Any) -> None:
        call_name = call_id(context, self.service.fresh_call_id)
        model = self.service.model.name
        client, group = client_of(context, self.service), group_of(context)
        async with self.service.call(call_name, model, Protocol.KSERVE_GRPC, client, group) as call:
            await context.send_initial_metadata(((REQUEST_ID_KEY, call_name),))
            session = StreamSession(self.service, call, self.limits)
            try:
                await session.serve(requests, context.write)
            except BaseException:
                # Cancelled by gRPC, or a write failed: either way the client is gone, and no
                # request of the stream may outlive the handler.
                call.hangup_reason = hangup_reason(context)
                await session.abort()
                raise
            await session.abort()
            if session.cancelled is not None:
                cancelled = RequestCancelled(session.cancelled)
                cancelled.usage = call.usage  # every request of the stream has ended
                raise cancelled


def inference_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The method handlers of ``inference.GRPCInferenceService`` bound to ``servicer``."""

    # Requests arrive as bytes and are parsed by the handlers, so that a malformed one is the
    # client's error (INVALID_ARGUMENT), and on a stream costs only that message.
    def unary(behaviour: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            behaviour, response_serializer=lambda message: message.SerializeToString()
        )

    s = servicer
    methods = {
        "ServerLive": unary(s.server_live),
        "ServerReady": unary(s.server_ready),
        "ModelReady": unary(s.model_ready),
        "ServerMetadata": unary(s.server_metadata),
        "ModelMetadata": unary(s.model_metadata),
        "ModelConfig": unary(s.model_config),
        "RepositoryIndex": unary(s.repository_index),
        "ModelInfer": unary(s.model_infer),
        # The stream's responses come serialized (gateway_server.grpc.responses).
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(s.model_stream_infer),
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)
