"""The harness the benchmarks, the demos and the tests share: one copy of each, imported by all
three (``tests/`` imports it; it imports nothing from ``tests/``).

- starting hangup's real processes and reading them: ``processes`` (spawn, ready files, process
  trees), ``waiting`` (the one polling loop), ``scrape`` (``/metrics`` as a scraper reads it),
  ``log_records``;
- what they run against: ``stack`` (a gateway and its proxy), ``envoy``, ``scale_out``,
  ``front_doors``, ``triton_server``, ``triton_io``, ``triton_vllm``, ``truss_server``,
  ``vllm_stack``, ``probe_gateway`` and ``sse_source`` (servers the benchmarks start);
- the fuzzers, batteries and soaks whose short runs are tests and long runs benchmarks:
  ``http_fuzz``, ``grpc_fuzz``, ``server_fuzz``, ``framing_cases``, ``framing_battery``,
  ``framing_stack``, ``recording_upstream``, ``raw_http``, ``naive_relay``, ``faults``,
  ``chaos``, ``chaos_traffic``, ``chaos_report``;
- the benchmarks' arithmetic and machinery: ``stats``, ``cgroups`` (CPU quotas), ``spread``
  (which process accepted a connection), ``aiperf_export``.

It ships in the image with ``bench/``, where the demos run on hangup's base dependencies alone:
what a demo imports (``processes``, ``waiting``, ``scrape``) must need nothing more
(``tests/pure/test_demo_ships_alone.py``). The other modules may need the test extras
(Hypothesis, h11, tritonclient, numpy) or the test suite's data (``tests/triton/models``,
``tests/truss/models``), but never pytest: fixtures stay in ``tests/``. Importing this package
imports none of its modules.
"""
