"""The proxy's HTTP/1.1 client (``client``: the pool and a request; ``connection``: one
connection and its parser), below both its users: the HTTP relay and the cancel adapters, each
on an instance of its own; and the gRPC upstream's address and channel (``grpc_target``: one
address, or several that calls are spread over)."""
