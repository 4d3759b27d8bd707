"""The skip plugin (``tests/support/skips.py``), run on a small suite of its own in a pytest of its
own: ``Unavailable`` is a skip that names what is missing, a ``KeyError`` in a fixture is an
error (it read as "not available" when fixtures caught ``LookupError``), every skip is listed in
the run's last lines, and under ``--require-all`` (CI) a skip fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.base.processes import REPO

SUITE = """
import pytest
from bench.harness.unavailable import Unavailable

@pytest.fixture(scope="session")  # pytest re-raises what it raised for each test that asks
def server():
    raise Unavailable("no frobd here: `make test` installs it")

@pytest.fixture
def buggy():
    return {}["missing"]

def test_needs_frobd(server):
    pass

def test_needs_frobd_too(server):
    pass

def test_finds_it_missing_itself():
    raise Unavailable("no frobd here: `make test` installs it")

@pytest.mark.skipif(True, reason="this CPU has no frob unit")
def test_needs_hardware():
    pass

def test_buggy_fixture(buggy):
    pass

def test_runs():
    pass
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_suite.py").write_text(SUITE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.skips", "-p", "no:cacheprovider",
         "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_suite.py"), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_unavailable_is_a_skip_listed_last_and_any_other_exception_an_error(
    tmp_path: Path,
) -> None:
    done = _pytest(tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout  # the buggy fixture's KeyError
    assert "1 failed" not in lines[-1] and "1 error" in lines[-1], lines[-1]
    assert "4 skipped" in lines[-1] and "1 passed" in lines[-1], lines[-1]
    listed = lines[lines.index(next(x for x in lines if "4 tests did not run" in x)) :]
    assert listed[1].split() == ["3", "unavailable:", "no", "frobd", "here:", "`make", "test`",
                                 "installs", "it"]  # fmt: skip
    for test in ("test_needs_frobd", "test_needs_frobd_too", "test_finds_it_missing_itself"):
        assert f"::{test}," in listed[2] + ",", listed[2]
    assert "this CPU has no frob unit" in listed[3]
    assert listed[-1] is lines[-1]  # then only pytest's own last line
    assert len(listed) == 6, listed


def test_under_require_all_a_skip_fails_the_run(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--require-all", "-k", "not buggy")
    last = done.stdout.splitlines()[-1]
    assert done.returncode == 1, done.stdout
    # A skip in set-up (a fixture's, a skipif mark's) fails as an error, one in the test a failure.
    assert "1 failed" in last and "3 errors" in last and "skipped" not in last, last
    assert "each a failure under --require-all (CI)" in done.stdout
    assert "skipped, and --require-all (CI) runs every test: this CPU has no frob unit" in (
        done.stdout
    )


def test_a_run_that_skips_nothing_passes_under_require_all(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--require-all", "-k", "test_runs")
    assert done.returncode == 0, done.stdout
    assert "did not run" not in done.stdout
