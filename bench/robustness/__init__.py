"""Does hangup hold against hostile clients, malformed bytes and faults? The long runs of what
``make test`` runs short.

``slow_clients``: slowloris and stalled bodies; ``protocol_fuzz``: HTTP/1.1 and gRPC fuzz against
the live processes; ``framing``: the framing battery against Envoy and the server's byte-level
fuzz; ``chaos_soak``: mixed traffic while every fault fires."""
