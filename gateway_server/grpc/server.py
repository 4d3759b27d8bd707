"""Starts and stops the gateway's gRPC listener (called by :mod:`gateway_server.server`).

One ``grpc.aio`` server on ``--host:--grpc-port`` serves ``inference.GRPCInferenceService``,
``hangup.v1.Cancellation``, ``grpc.health.v1.Health`` (overall and per service: ``SERVING``
while ready, ``NOT_SERVING`` once draining) and server reflection. A request message that does not
decode is ``INVALID_ARGUMENT`` on every one of them (:mod:`gateway_server.grpc.decoding`). The
listener holds at most ``--max-connections`` connections and ``--grpc-max-calls`` calls, a
client's share of them ``--grpc-max-calls-per-client`` (:mod:`gateway_server.grpc.limits`).

Shutdown follows the gateway's sequence: :meth:`GrpcServerHandle.stop_accepting` marks health
``NOT_SERVING`` (new generation calls are refused as the service is draining), the gateway lets
calls finish or cancels them, then :meth:`GrpcServerHandle.stop` closes the listener.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from gateway_server.config import GatewayConfig
from gateway_server.grpc import cancel, inference
from gateway_server.grpc.decoding import InvalidMessagesAreInvalidArgument
from gateway_server.grpc.limits import CallLimits
from gateway_server.grpc.stream import StreamLimits
from gateway_server.service import GenerationService
from hangup_contract.protos import cancellation_pb2, inference_pb2
from hangup_contract.runtime.connections import grpc_server_options

_SERVICES = (inference.SERVICE_NAME, cancel.SERVICE_NAME)


def _reflected() -> descriptor_pool.DescriptorPool:
    """A pool holding every served file: hangup's live in a pool of their own (see protos)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (inference_pb2, cancellation_pb2, health_pb2, reflection_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


@dataclass
class GrpcServerHandle:
    server: Any
    health: Any
    port: int
    process_port: int | None = None
    """This process's own gRPC port (``--grpc-process-ports``), if it has one."""

    async def stop_accepting(self) -> None:
        """Report NOT_SERVING to health checks (load balancers stop sending new calls)."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float | None = None) -> None:
        """Close the listener; calls still running after ``grace`` seconds are cancelled."""
        await self.server.stop(grace)


async def start_grpc_server(service: GenerationService, config: GatewayConfig) -> GrpcServerHandle:
    """Bind ``config.host:config.grpc_port`` (and this process's own port, if it has one) and
    serve. Raises OSError when it cannot bind."""
    # A larger request message is refused by gRPC itself (RESOURCE_EXHAUSTED), unread: the
    # limit is what one parse may cost the event loop (docs/security.md).
    options = [("grpc.max_receive_message_length", config.grpc_message_limit)]
    if config.max_connections:  # gRPC core closes one more as it opens, before Python sees it
        options.append(("grpc.max_allowed_incoming_connections", config.max_connections))
    refused = service.metrics.calls_refused
    calls = CallLimits(
        config.grpc_max_calls,
        config.grpc_max_calls_per_client,
        service.clients,
        lambda reason: refused.labels("grpc", reason.value).inc(),
    )
    server = grpc.aio.server(
        options=options + grpc_server_options(config.connection_limits),
        interceptors=[calls, InvalidMessagesAreInvalidArgument()],  # a refused call is unread
    )
    limits = StreamLimits(config.grpc_stream_max_requests, config.grpc_stream_buffer_bytes)
    server.add_generic_rpc_handlers(
        [
            inference.inference_handler(inference.InferenceServicer(service, limits)),
            cancel.cancellation_handler(cancel.CancellationServicer(service, config.cancel_token)),
        ]
    )
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    reflection.enable_server_reflection(
        (*_SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server, pool=_reflected()
    )
    port = server.add_insecure_port(f"{config.host}:{config.grpc_port}")
    if port == 0:
        raise OSError(f"cannot bind the gRPC listener to {config.host}:{config.grpc_port}")
    own = None
    if config.grpc_process_ports is not None:
        own = server.add_insecure_port(f"{config.host}:{config.grpc_process_ports}")
        if own == 0:
            raise OSError(
                f"cannot bind this process's gRPC port {config.host}:{config.grpc_process_ports}"
            )
    await server.start()
    for name in ("", *_SERVICES):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    return GrpcServerHandle(server, checks, port, own)
