"""A pytest plugin: skips only for absence, listed last, and none at all under ``--require-all``.

- A test or fixture that raises :class:`~bench.harness.unavailable.Unavailable` (a server, a tool
  or an engine this machine lacks, the message saying how to get it) is skipped with that
  message; any other exception is an error, ``LookupError`` and ``KeyError`` included.
- Every skip, whatever made it (``Unavailable``, a ``skipif`` mark, ``pytest.skip``), is listed
  in the run's last lines, grouped by reason, with the tests it hid.
- ``--require-all`` (``make test REQUIRE_ALL=1``; CI's ``.ci/run``): a skip is a failure, with its
  reason. CI's machine has every tier, so a skip there is an install that failed.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from bench.harness.unavailable import Unavailable


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-all",
        action="store_true",
        help="every test must run: a skip fails the run, with its reason (CI)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Skips(config.getoption("require_all")), "hangup-skips")


def _skip_unavailable(exc: Unavailable) -> None:
    pytest.skip(f"unavailable: {exc}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Unavailable as exc:  # a fixture found its thing missing
        _skip_unavailable(exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Unavailable as exc:
        _skip_unavailable(exc)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class Skips:
    """Every skip of the run (test id, reason); under ``require_all``, each one a failure."""

    def __init__(self, require_all: bool) -> None:
        self.require_all = require_all
        self.skipped: list[tuple[str, str]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = _reason(report)
            self.skipped.append((item.nodeid, reason))
            if self.require_all:
                report.outcome = "failed"
                report.longrepr = f"skipped, and --require-all (CI) runs every test: {reason}"
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module skipped whole
            self.skipped.append((report.nodeid, _reason(report)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and self.require_all and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None, None, None]:
        # The outermost wrapper: written after pytest's own short summary, before its last line.
        result = yield
        if self.skipped:
            self._write(terminalreporter)
        return result

    def _write(self, terminal: Any) -> None:
        by_reason: dict[str, list[str]] = {}
        for nodeid, reason in self.skipped:
            by_reason.setdefault(reason, []).append(nodeid)
        title = f"{len(self.skipped)} tests did not run"
        if self.require_all:
            title += ": each a failure under --require-all (CI)"
        terminal.write_sep("=", title, red=self.require_all, yellow=not self.require_all)
        for reason, nodeids in by_reason.items():
            more = f" and {len(nodeids) - 3} more" if len(nodeids) > 3 else ""
            terminal.write_line(f"{len(nodeids):4} {reason}")
            terminal.write_line(f"       {', '.join(nodeids[:3])}{more}")
