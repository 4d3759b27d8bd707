"""The ``--workers`` supervisor's ``/metrics`` answers whatever state its workers' metrics files
are in: a worker starting has created its file but not sized it, one cut off left a file cut
short. What can be read is summed, the rest skipped and counted (a 500 before)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from bench.base.scrape import parse, total
from proxy.config import Config
from proxy.workers import Supervisor
from tests.support.metrics_files import unreadable_files, write_counter


def test_a_scrape_skips_and_counts_files_it_cannot_read_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its run directory goes here
    supervisor = Supervisor(Config(workers=2), [])
    (run_dir,) = tmp_path.iterdir()
    labels = {"protocol": "http", "outcome": "completed"}
    write_counter(run_dir, 4001, "hangup_proxy_requests", 5.0, **labels)
    write_counter(run_dir, 4002, "hangup_proxy_requests", 6.0, **labels)
    bad = unreadable_files(run_dir)

    samples = parse(generate_latest(supervisor.registry).decode())
    assert total(samples, "hangup_proxy_requests_total", outcome="completed") == 11.0
    assert total(samples, "hangup_proxy_metrics_files_skipped_total") == len(bad)
    assert total(samples, "hangup_proxy_workers") == 0  # its own families are still there
