"""The environment guard (``tests/support/environment.py``) shown able to fail: on a suite of its
own, in a pytest of its own, a test that leaves a variable set fails, naming it, and one that
restores what it changed passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.base.processes import REPO

SUITE = """
import os

def test_leaves_a_variable_set():
    os.environ["HANGUP_LEFT_BEHIND"] = "/gone"

def test_restores_what_it_changed(monkeypatch):
    monkeypatch.setenv("HANGUP_PUT_BACK", "1")
"""


def test_a_variable_left_set_fails_the_test_that_set_it(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.environment", "-p",
         "no:cacheprovider", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_suite.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "2 passed, 1 error" in done.stdout.splitlines()[-1], done.stdout  # a teardown error
    assert "HANGUP_LEFT_BEHIND: None -> '/gone'" in done.stdout
    assert "test_leaves_a_variable_set" in done.stdout
