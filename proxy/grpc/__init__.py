"""The gRPC listener: the relay of each call (``relay``), the metadata rules (``metadata``), a
vanished client told from a cancelled call (``peer``), the upstream's status kept from grpc.aio's
write race (``status``)."""
