"""The protocols hangup's two programs speak, as ``.proto`` files with checked-in generated
modules (see :mod:`.regenerate`).

- ``cancellation.proto``: ``hangup.v1.Cancellation/Cancel``, the cancel call over gRPC. Its
  messages register in protobuf's default descriptor pool: the ``hangup.v1`` package clashes with
  nothing.
- ``inference.proto``: package ``inference``, the KServe v2 / Triton subset hangup speaks (the
  gateway serves it; the proxy's Triton bridge calls it), with the public protocol's message names
  and field numbers (wire-compatible). Its messages register in :data:`.pool.POOL`, not the
  default pool: Triton's own client declares the same symbols.
"""
