"""The loads' one JSON line reaches the benchmark that reads it whole
(``bench.instruments.stats``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.base.processes import REPO

# A load's shape: uvloop ran, then a large line for a parent that is not reading yet.
CHILD = """
import asyncio, sys
import uvloop
from bench.instruments.stats import print_json_line
uvloop.run(asyncio.sleep(0))
print_json_line({"latencies": [0.0012345] * 60000})
"""


def test_a_large_line_after_uvloop_arrives_whole() -> None:
    """A load's latencies (hundreds of KB) written after uvloop ran, to a pipe nobody reads for
    a moment: ``print`` delivered the first 64 KiB and a newline (with ``PYTHONUNBUFFERED``, as
    in CI), and the benchmark failed parsing it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, env=env, cwd=REPO
    )
    time.sleep(1.0)  # the pipe fills before the parent reads
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    assert len(json.loads(out)["latencies"]) == 60000
