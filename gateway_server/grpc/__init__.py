"""The gateway's gRPC side: KServe v2 / Triton ``inference.GRPCInferenceService``, the
``hangup.v1.Cancellation`` cancel API, health checking and reflection.

- :mod:`.server` starts and stops the listener (``start_grpc_server``, called by the gateway);
- :mod:`.inference` serves health, metadata, ``ModelInfer`` and ``ModelStreamInfer``;
- :mod:`.stream` is one decoupled ``ModelStreamInfer`` stream (many requests, sequences);
- :mod:`.tensors` turns tensors into a text request and text into a response (no I/O);
- :mod:`.cancel` is the cancel API over gRPC; :mod:`.common` what the handlers share.

The schema is :mod:`hangup_contract.protos.inference_pb2` (hangup's own ``inference.proto``, shared
with the proxy's Triton bridge; its checked-in generated module registers in a descriptor pool of
its own, so a process may also load Triton's client, which declares the same ``inference``
symbols).
"""
