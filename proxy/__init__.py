"""hangup's sidecar proxy: relays HTTP/1.1 (SSE included) and gRPC to the model server, and turns
every client hang-up into an explicit cancel call on the upstream."""

__version__ = "0.1.0"
