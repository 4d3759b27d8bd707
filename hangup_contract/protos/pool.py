"""hangup's descriptor pool: where the generated ``*_pb2`` modules here register their files.

Kept apart from protobuf's default pool so hangup's ``inference`` package and Triton's (which
declare the same symbols) can be loaded in one process; see :mod:`.regenerate`.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
