"""Tests of the tooling, not of the product: the benchmarks' catalog and arithmetic, what the
image ships for the demos, the test suite's own plugins and guards (skips, the environment
guard), the container engine and the Triton tier's records. No I/O beyond files and the odd
subprocess; they run with the base tier."""
