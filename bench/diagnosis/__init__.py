"""Diagnoses, not benchmarks: tools for chasing a figure that moved or a test that failed once.

``api_silence``: does a gateway API process go silent under the vLLM tier's load, and where is
it while it is; ``pause_watch``: does the whole machine stop now and then;
``listener_spread``: how the shared listener spreads open connections over a server's
processes."""
