"""What only the benchmarks use (the tests import none of it, save the tooling tests of its
arithmetic): the figures' arithmetic (``stats``), CPU quotas (``cgroups``), which process
accepted each connection of a shared port (``socket_owners``), AIPerf's export read
(``aiperf_export``), and two processes the benchmarks start, each ``python -m`` of its own: an
SSE source to relay (``sse_source``) and a gateway that logs when each abort was applied
(``probe_gateway``).

The test-and-benchmark machinery is ``bench/harness/``, what the demos need ``bench/base/``.
"""
