"""The one polling loop the tests use: ``bench/harness/waiting.py``, which ships with the demos
and benchmarks (the image has no ``tests/``)."""

# re-exported from the harness the demos ship with: the tests' one place
from bench.harness.waiting import POLL_INTERVAL as POLL_INTERVAL
from bench.harness.waiting import poll_until as poll_until
from bench.harness.waiting import run_ready_callbacks as run_ready_callbacks
from bench.harness.waiting import wait_until as wait_until
