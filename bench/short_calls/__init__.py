"""What does a short call (1 KiB JSON in, 1 KiB out, an upstream that answers at once) cost
through the proxy, against Envoy and against the least a Python relay can spend?

``one_core``: the proxy and Envoy at one simulated core each, saturated and paced, and the
Triton bridge; ``free``: no quota, to compare two trees quickly; ``ab``: two trees' proxies
paired in one run; ``floor``: a minimal relay as a measuring stick. ``load`` is their load
generator (a process of its own). The relays and quotas are ``bench.scaling``'s
(``bench.scaling.relays``, ``bench.scaling.cores.load_group``)."""
