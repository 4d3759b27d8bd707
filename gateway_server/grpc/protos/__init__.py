"""hangup's ``.proto`` files and their generated modules (see :mod:`.regenerate`).

- ``inference.proto``: package ``inference``, the KServe v2 / Triton subset hangup serves, with
  the public protocol's message names and field numbers (wire-compatible).
- ``cancellation.proto``: package ``hangup.v1``, the cancel API over gRPC.

The generated modules register in :data:`.pool.POOL`, not protobuf's default pool.
"""
