"""The chaos soak, short (``bench/harness/chaos.py``; the long run is
``bench.robustness.chaos_soak``): a few thousand mixed calls through the proxy, half hanging up at
random points, while each fault fires once: upstream connections reset, the gateway stopped past the
cancel deadline, the gateway killed, the proxy killed, the proxy drained, the engine killed (the
gateway starts it again), the engine hung past the cancel deadline, the gateway drained; then a last
phase without a fault.

After every phase: nothing in flight on the gateway, every completed call byte-identical to the
direct one, no stream that ended cleanly without its end marker, every cancel answered or given
up on and counted; the pod serves again after every fault; memory and open files do not grow
within a process; after every fault the engine serves again, idle once the clients left; every
line the processes logged is a JSON record, and none is a library's error.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.harness import chaos, chaos_report
from bench.harness.faults import Pod

pytestmark = pytest.mark.slow

PHASE_S = 6.0
CONCURRENCY = 16
SCHEDULE = [*chaos.FAULTS, "none"]


async def test_chaos_soak_leaves_no_zombie_and_no_wrong_answer(tmp_path: Path) -> None:
    gateway_args = ["--sim-slots", "8", "--sim-faults"]
    async with Pod(tmp_path, gateway_args, chaos.PROXY_ARGS) as pod:
        reports = await chaos.run_schedule(
            pod, SCHEDULE, seconds=PHASE_S, concurrency=CONCURRENCY, rng=random.Random(5)
        )
    chaos_report.assert_clean_and_serving(reports)
    stopped = reports[SCHEDULE.index("stop_gateway")]
    assert stopped.gave_up >= chaos.STOPPED_HANG_UPS  # counted, and logged (no finding above)
    hung = reports[SCHEDULE.index("hang_engine")]
    assert hung.gave_up >= chaos.STOPPED_HANG_UPS
    assert reports[SCHEDULE.index("kill_engine")].engine_restarts == 1
    calls = sum(sum(r.calls.values()) for r in reports)
    assert calls > 1000, calls
    for name in ("gateway", "proxy"):
        rss_kib, files = chaos_report.growth(reports, name)
        assert files <= 16 and rss_kib <= 64 * 1024, (name, rss_kib, files)
    stray = chaos_report.stray_log_lines(tmp_path)
    assert not stray, "\n".join(stray[:10])
