"""What the bridge knows of Triton's models, read over gRPC and kept for a while.

``generate`` maps JSON keys to inputs by the model's metadata (each input's datatype) and its
configuration (whether the model is decoupled). Both are read with
``ModelMetadata`` and ``ModelConfig`` the first time a model (and version) is called, kept for
``TTL_S``, and read again after that, or at once after a call to the model was refused with 400 or
404 (it may have been unloaded, or reloaded with other inputs: one metadata read per refused
call). At most ``MAX_MODELS`` are kept; an error is never kept.
"""

from __future__ import annotations

import time

import grpc

from hangup_contract.protos import inference_pb2 as pb
from proxy.triton.codec import ModelInputs

SERVICE = "/inference.GRPCInferenceService/"
TTL_S = 30.0
MAX_MODELS = 1024
READ_TIMEOUT_S = 10.0


class Models:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._metadata = channel.unary_unary(
            SERVICE + "ModelMetadata",
            request_serializer=pb.ModelMetadataRequest.SerializeToString,
            response_deserializer=pb.ModelMetadataResponse.FromString,
        )
        self._config = channel.unary_unary(
            SERVICE + "ModelConfig",
            request_serializer=pb.ModelConfigRequest.SerializeToString,
            response_deserializer=pb.ModelConfigResponse.FromString,
        )
        self._known: dict[tuple[str, str], tuple[float, ModelInputs]] = {}

    async def inputs(self, model: str, version: str) -> ModelInputs:
        """The model's inputs; raises ``grpc.aio.AioRpcError`` as Triton answered."""
        key = (model, version)
        known = self._known.get(key)
        if known is not None and time.monotonic() - known[0] < TTL_S:
            return known[1]
        metadata = await self._metadata(
            pb.ModelMetadataRequest(name=model, version=version), timeout=READ_TIMEOUT_S
        )
        config = (
            await self._config(
                pb.ModelConfigRequest(name=model, version=version), timeout=READ_TIMEOUT_S
            )
        ).config
        found = ModelInputs(
            name=model,
            version=version,
            datatypes={i.name: i.datatype for i in metadata.inputs},
            decoupled=config.model_transaction_policy.decoupled,
            outputs=frozenset(o.name for o in metadata.outputs),
        )
        if len(self._known) >= MAX_MODELS:
            self._known.pop(next(iter(self._known)))
        self._known[key] = (time.monotonic(), found)
        return found

    def forget(self, model: str, version: str) -> None:
        """Triton no longer knows the model: read it again next time."""
        self._known.pop((model, version), None)
