"""The machinery the benchmarks and the tests share: one copy of each, imported by both
(``tests/`` imports it; it imports nothing from ``tests/``). What the demos need is
``bench/base/`` (starting processes, waiting, scraping), what only the benchmarks use
``bench/instruments/``.

- what they run against: ``stack`` (a gateway and its proxy), ``envoy``, ``scale_out``,
  ``front_doors``, ``vllm_stack``, ``triton/`` (a real Triton, with vLLM inside or not, and the
  models it serves) and ``truss/`` (Truss's own model server and its models), ``log_records``;
- the fuzzers, batteries and soaks whose short runs are tests and long runs benchmarks:
  ``http_fuzz``, ``grpc_fuzz``, ``server_fuzz``, ``hostile``, ``hostile_parsers``,
  ``framing_cases``, ``framing_battery``, ``framing_stack``, ``recording_upstream``,
  ``raw_http``, ``naive_relay``, ``faults``, ``chaos``, ``chaos_traffic``, ``chaos_report``,
  ``memory_transport`` (a connection's transport with no socket);
- ``unavailable``: what a fixture raises when its thing is missing (a skip, or a failure in CI).

It does not ship in the image. Its modules may need the test extras (Hypothesis, h11,
tritonclient, numpy), but never pytest: fixtures stay in ``tests/``. Importing this package
imports none of its modules.
"""
