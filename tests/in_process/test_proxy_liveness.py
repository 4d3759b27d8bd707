"""The proxy supervisor's liveness (``/healthz`` with ``--workers``): alive while a worker serves
or one may soon again; dead once none has served for the limit (they keep exiting)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from proxy.config import Config
from proxy.workers import Supervisor
from tests.support.waiting import poll_until


def test_alive_unless_no_worker_served_for_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its run directory goes here
    supervisor = Supervisor(Config(workers=2), [], none_serving_limit=0.05)
    supervisor.serving_changed(2)
    assert supervisor.live()
    supervisor.serving_changed(1)  # one worker exited: it is being started again
    supervisor.serving_changed(0)
    assert supervisor.live(), "every worker gone for a moment: they may come back"
    poll_until(lambda: not supervisor.live(), 5, "liveness to fail with no worker serving")
    supervisor.serving_changed(1)
    assert supervisor.live()
