"""The gateway's ``.proto`` file and its generated module.

- ``inference.proto``: package ``inference``, the KServe v2 / Triton subset hangup serves, with
  the public protocol's message names and field numbers (wire-compatible).

The generated module registers in :data:`.pool.POOL`, not protobuf's default pool, and is
regenerated with ``python -m hangup_contract.protos.regenerate``. The cancel API's proto lives
with the contract (``hangup_contract/protos``).
"""
