"""Do the proxy's workers and the gateway's API processes scale with cores? Each relaying process
gets a simulated core (a CPU quota, ``bench.instruments.cgroups``) or a real one of its own.

``cores`` is the benchmark (tables for the proxy beside Envoy and for the gateway); ``relays``
starts what it measures, ``load`` is its load generator (a process of its own), ``report`` its
checks and table. ``api_process_cost`` separates what one of several API processes costs per
event; ``grpc_spread`` is gRPC through the proxy into API processes. ``requirements.txt`` and
``wheels.sh`` install what ``cores`` needs on a machine without network."""
