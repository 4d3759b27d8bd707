"""``hangup.v1.Cancellation/Cancel``: the cancel call over gRPC.

``cancellation.proto`` is the source of truth; ``cancellation_pb2`` is generated from it and
checked in (see :mod:`.regenerate`). Its messages register in protobuf's default descriptor pool:
the ``hangup.v1`` package clashes with nothing.
"""
