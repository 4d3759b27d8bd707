"""What does the proxy cost, and how soon does a hang-up through it reach the engine?

``cancel``: hang-up → engine abort, direct, through the proxy and through Envoy; ``overhead``:
latency, events/s and memory against Envoy and no proxy; ``workers``: relaying on more than one
core; ``cancel_write``: the proxy's own share of a cancel, in one process."""
