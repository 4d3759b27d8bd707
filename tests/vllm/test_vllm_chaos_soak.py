"""The chaos soak with the real engine, short (``bench/harness/chaos.py``; the long run is
``bench.robustness.chaos_soak --engine vllm``): mixed calls through the proxy in front of a
one-worker vLLM gateway, half hanging up at random points, while the engine core is SIGKILLed (the
gateway starts it again), SIGSTOPped until the proxy has given up on the cancels of calls that hung
up meanwhile and then continued, and the gateway is drained and restarted; then a last phase without
a fault.

After every phase: nothing in flight on the gateway, the engine serving with its KV cache free,
every completed (greedy) call byte-identical to the same call made directly, no stream that ended
cleanly without its end marker, every cancel answered or given up on and counted, nothing of the
drained gateway's process group left running.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.harness import chaos, chaos_report
from bench.harness.faults import Pod
from bench.harness.vllm_stack import START_TIMEOUT_S
from tests.support.vllm_fixtures import requires_vllm

# Three engine starts (the gateway's, the killed core's, the drained gateway's).
pytestmark = [pytest.mark.vllm, requires_vllm, pytest.mark.timeout(1200)]

PHASE_S = 10.0
CONCURRENCY = 4
SCHEDULE = [*chaos.VLLM_FAULTS, "none"]


async def test_chaos_soak_with_vllm_leaves_no_zombie_and_no_wrong_answer(
    tiny_model: Path, tmp_path: Path
) -> None:
    gateway_args = chaos.vllm_gateway_args(str(tiny_model))
    async with Pod(tmp_path, gateway_args, chaos.PROXY_ARGS, "vllm", START_TIMEOUT_S) as pod:
        reports = await chaos.run_schedule(
            pod, SCHEDULE, seconds=PHASE_S, concurrency=CONCURRENCY, rng=random.Random(7)
        )
    chaos_report.assert_clean_and_serving(reports)
    assert reports[SCHEDULE.index("kill_engine")].engine_restarts == 1
    assert reports[SCHEDULE.index("hang_engine")].gave_up >= chaos.STOPPED_HANG_UPS
    hung_up = sum(n for r in reports for k, n in r.calls.items() if "hang-up" in k)
    assert hung_up > 20, hung_up
