"""What do a gRPC cancel and a gRPC relay cost, direct, through the proxy and through Envoy, and
what does grpcio itself spend?

``paths``: the three ways to the gateway and a small client, shared by ``cancel`` (cancel →
engine abort), ``relay`` (what a relay adds to a call and a stream) and ``floor`` (grpcio with no
hangup code)."""
