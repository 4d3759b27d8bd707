"""A stand-in for Triton's gRPC service, in the test's event loop, for the bridge's in-process
tests (``--cancel-adapter triton``): what the bridge asks of Triton, answered as Triton answers
it, with no model behind. The real Triton is in ``tests/triton/``.

One model, ``echo`` (version 1, not decoupled): inputs ``INPUT0`` (FP32), ``TEXT`` (BYTES),
``FLAG`` (BOOL) and ``COUNT`` (INT64), output ``OUTPUT0``: the first input's raw data, as it came.
Any other model is Triton's NOT_FOUND in its words. What reached ``ModelInfer`` is kept in
``received``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from hangup_contract.protos import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
MODEL = "echo"
INPUTS = {"INPUT0": "FP32", "TEXT": "BYTES", "FLAG": "BOOL", "COUNT": "INT64"}
_CONFIG_TYPES = {"FP32": pb.TYPE_FP32, "BYTES": pb.TYPE_STRING, "BOOL": pb.TYPE_BOOL,
                 "INT64": pb.TYPE_INT64}  # fmt: skip


@dataclass
class StandIn:
    address: str
    received: list[pb.ModelInferRequest] = field(default_factory=list)


async def _abort_unknown(name: str, context: grpc.aio.ServicerContext) -> None:
    if name != MODEL:
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found"
        )


@contextlib.asynccontextmanager
async def running_stand_in() -> AsyncIterator[StandIn]:
    """The stand-in on 127.0.0.1:0, stopped when the block ends."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    stand_in = StandIn("")

    async def metadata(request: pb.ModelMetadataRequest, context: Any) -> Any:
        await _abort_unknown(request.name, context)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="python",
            inputs=[tensor(name=n, datatype=t, shape=[-1]) for n, t in INPUTS.items()],
            outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[-1])],
        )

    async def config(request: pb.ModelConfigRequest, context: Any) -> Any:
        await _abort_unknown(request.name, context)
        inputs = [pb.ModelInput(name=n, data_type=_CONFIG_TYPES[t], dims=[-1], optional=True)
                  for n, t in INPUTS.items()]  # fmt: skip
        return pb.ModelConfigResponse(
            config=pb.ModelConfig(name=MODEL, backend="python", input=inputs)
        )

    async def infer(request: pb.ModelInferRequest, context: Any) -> Any:
        await _abort_unknown(request.model_name, context)
        stand_in.received.append(request)
        response = pb.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        if request.raw_input_contents:  # /infer's inputs come raw, generate's as contents
            first = request.inputs[0]
            response.outputs.add(name="OUTPUT0", datatype=first.datatype, shape=first.shape)
            response.raw_output_contents.append(request.raw_input_contents[0])
        return response

    def unary(behaviour: Any, kind: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            behaviour,
            request_deserializer=kind.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )

    methods = {
        "ModelMetadata": unary(metadata, pb.ModelMetadataRequest),
        "ModelConfig": unary(config, pb.ModelConfigRequest),
        "ModelInfer": unary(infer, pb.ModelInferRequest),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, methods)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stand_in.address = f"127.0.0.1:{port}"
    try:
        yield stand_in
    finally:
        await server.stop(None)
