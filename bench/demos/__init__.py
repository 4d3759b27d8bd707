"""The demos: what hangup does, shown in a few seconds on 127.0.0.1 (``make demo``).

``proxy``: a client streams through the proxy to the gateway and hangs up; ``gateway``: an
operator cancels a stream by id through the gateway's cancel API. They run in the image too
(``docker run --rm hangup:0.1.0 python -m bench.demos.proxy``), on hangup's base dependencies
alone: what they import is checked by ``tests/tooling/test_demo_ships_alone.py``. ``python -m
bench`` lists them with the benchmarks."""
