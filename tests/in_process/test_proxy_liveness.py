"""The proxy supervisor's liveness (``/healthz`` with ``--workers``): alive while a worker serves
or one may soon again; dead once none has served for the limit (they keep exiting). A proxy
whose event loop stalls says so in its log, with where it was, and counts it."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import pytest

from bench.base.waiting import poll_until, wait_until
from proxy.config import Config
from proxy.workers import Supervisor
from tests.support.proxy_harness import metric, running_proxy


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


async def test_a_stalled_event_loop_is_logged_with_its_stack_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hangup.proxy.server")
    async with running_proxy("http://127.0.0.1:9", loop_stall_log=0.3) as proxy:
        time.sleep(1.0)  # noqa: ASYNC251 (the fault under test: something blocking the loop)

        def logged(name: str) -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage() == name]

        await wait_until(lambda: logged("event_loop_resumed"), what="the stall's end logged")
        (stalled,) = logged("event_loop_stalled")
        assert "test_a_stalled_event_loop_is_logged" in stalled.fields["stack"]  # type: ignore[attr-defined]
        (resumed,) = logged("event_loop_resumed")
        assert 0.7 <= resumed.fields["stalled_s"] <= 1.5  # type: ignore[attr-defined]
        assert metric(proxy, "hangup_proxy_event_loop_stalls_total") == 1
