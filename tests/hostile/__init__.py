"""The hostile-client tier: property tests that feed every parser a client reaches hostile input up
to its limit within a CPU budget (``bench.harness.hostile``), and attacks tried against live
processes (the sidecar and the gateway) with their event loops watched. docs/security.md lists
what each one holds the product to."""
