"""The suite's leak guard (``tests/support/leaks.py``), run on a scripted test file in a pytest of
its own: a test that leaves a connection open fails itself, naming where each of its sockets was
made; sockets a module-scoped fixture holds on purpose are not reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.base.processes import REPO, child_env

SCRIPTED = """
import asyncio
import socket

import pytest


@pytest.fixture(scope="module")
def held():
    a, b = socket.socketpair()
    yield a
    a.close()
    b.close()


def test_uses_a_module_socket(held):
    held.send(b"x")


class Accepted(asyncio.Protocol):
    made = None

    def connection_made(self, transport):
        Accepted.made.set()


@pytest.mark.asyncio
async def test_leaves_a_connection_open():
    loop = asyncio.get_running_loop()
    Accepted.made = asyncio.Event()
    server = await loop.create_server(Accepted, "127.0.0.1", 0)  # LISTENER
    port = server.sockets[0].getsockname()[1]
    await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)  # CLIENT
    await Accepted.made.wait()  # both sides are transports now
    server.close()


def test_closes_what_it_opens(held):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
"""
OPTIONS = ["-c", "/dev/null", "-o", "asyncio_default_fixture_loop_scope=function", "-W", "error"]


def test_a_leak_fails_the_test_that_made_it_with_where(tmp_path: Path) -> None:
    (tmp_path / "test_scripted.py").write_text(SCRIPTED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.leaks", "-p", "no:cacheprovider",
         *OPTIONS, "--rootdir", str(tmp_path), "-q", "-rA", str(tmp_path / "test_scripted.py")],
        capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "3 passed, 1 error" in out, out  # a teardown error, the test's own assertions passed
    # the summary line is "ERROR <node id>", then " - <message>" when the terminal is wide enough
    errors = [line.split()[1] for line in out.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1 and errors[0].endswith("::test_leaves_a_connection_open"), out
    # the error's own section: the short summary after it repeats the message in full when
    # pytest believes it runs in CI (the CI variable set), and cut to one line otherwise
    report = out.split("ERROR at teardown of test_leaves_a_connection_open")[1]
    report = report.split("\n=====")[0]
    made = [line for line in report.splitlines() if line.strip() == "made at:"]
    assert len(made) == 2, report  # both sides of the connection, once each
    assert report.count("unclosed transport") == 2, report
    assert "# LISTENER" in report and "# CLIENT" in report, report  # where each was made
