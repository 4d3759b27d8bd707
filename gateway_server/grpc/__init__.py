"""The gateway's gRPC side: KServe v2 / Triton ``inference.GRPCInferenceService``, the
``hangup.v1.Cancellation`` cancel API, health checking and reflection.

The schemas live in :mod:`gateway_server.grpc.protos` (hangup's own ``.proto`` files, with
checked-in generated modules). They share the ``inference`` package with Triton's, so a process
that serves them must not also import ``tritonclient`` (protobuf refuses a second definition of
the same symbols); tests and benchmarks run the gateway as its own process.
"""
