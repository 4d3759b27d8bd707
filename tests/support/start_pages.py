"""The start pages (``docs/start-*.md``) run as a reader runs them: each page's test takes the
page's own command blocks and runs them, against the real servers its tier already runs.

A page marks what its test does with a comment before a fenced block:

- ``<!-- run -->`` before a ``sh`` block: its commands run in order, each as bash runs it, in a
  folder of the test's own (where the page writes its files). ``hangup-proxy`` and
  ``hangup-gateway`` lines are started and left running, as a reader leaves them in a terminal of
  their own; a line ending in ``&`` runs beside the next, which waits until the sidecar holds the
  call; every other line must exit 0, but a ``curl --max-time`` must give up (exit 28: the client
  hung up).
- ``<!-- output -->`` before a ``text`` block: lines the run block before it printed, each found
  among the lines it printed, in any order (a call in the background prints when it ends); a
  ``...`` in a line stands for anything.
- ``<!-- server -->`` before a ``sh`` block: the reader's own server as they start it. The tier's
  session server plays it (the same program, started by the tier's fixture): the test checks that
  the page's line names that program and flags it knows.

What differs between the reader's machine and the test's is mapped, and only this: the ports a
page names are the defaults (8000 and 8001 the server's, 8080, 8081 and 9090 the sidecar's), and
each ``localhost:PORT`` or ``127.0.0.1:PORT`` becomes the ephemeral port of the process the test
runs there; the processes a page starts get ``--http-port 0`` and their other ports so; and a
page test may name words to replace (the reader's model name by the test's model).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.base.processes import REPO, Process, child_env, start
from bench.base.scrape import metric_sum
from bench.base.waiting import poll_until
from bench.harness.unavailable import Unavailable

DOCS = REPO / "docs"
BLOCK = re.compile(r"<!-- (run|output|server) -->\s*\n```(\w*)\n(.*?)\n```", re.S)
ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):(8000|8001|8080|8081|9090)\b")
STARTED = {"hangup-proxy": "proxy", "hangup-gateway": "gateway_server"}
PORT_FLAGS = {
    "proxy": ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0"],
    "gateway_server": ["--http-port", "0", "--grpc-port", "0"],
}
GAVE_UP = 28  # curl's exit code when --max-time ran out
CALL_S = 60.0  # how long a command may take; a call held in the background, at most this


@dataclass
class Block:
    kind: str  # run, output, server
    text: str

    def lines(self) -> list[str]:
        """The block's commands: continued lines joined, comments and blank lines left out."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def blocks(page: str) -> list[Block]:
    """The marked blocks of ``docs/<page>``, in order."""
    text = (DOCS / page).read_text()
    found = [Block(kind, body) for kind, _, body in BLOCK.findall(text)]
    assert found, f"docs/{page} marks no block"
    return found


@dataclass
class Session:
    """One reader's terminals: the test's folder, the addresses mapped so far, the words to
    replace, and what the page started."""

    work: Path
    addresses: dict[str, str]  # default port -> host:port
    words: dict[str, str]
    stack: contextlib.ExitStack
    started: dict[str, Process] = field(default_factory=dict)

    def mapped(self, line: str) -> str:
        for word, ours in self.words.items():
            line = line.replace(word, ours)

        def address(match: re.Match[str]) -> str:
            port = match.group(1)
            assert port in self.addresses, f"nothing the test runs listens where {line!r} goes"
            return self.addresses[port]

        return ADDRESS.sub(address, line)

    def run(self, block: Block) -> list[str]:
        """Run ``block``'s lines; what they printed."""
        printed: list[str] = []
        background: list[tuple[subprocess.Popen[str], str]] = []
        for line in block.lines():
            line = self.mapped(line)
            argv = shlex.split(line, comments=True)
            if argv and argv[0] in STARTED:
                self.start(STARTED[argv[0]], self.resolved(argv[1:]))
            elif line.rstrip().endswith("&"):
                background.append((self.shell(line.rstrip().removesuffix("&")), line))
                self.wait_held(len(background))
            else:
                printed += self.finish(self.shell(line), line, "--max-time" in argv)
        for call, line in background:
            printed += self.finish(call, line, False)
        return printed

    def shell(self, line: str) -> subprocess.Popen[str]:
        here = Path(sys.executable).parent  # hangup-proxy, hangup-gateway, python3 as installed
        env = child_env({"PATH": f"{here}{os.pathsep}{os.environ.get('PATH', '')}"})
        return subprocess.Popen(
            ["bash", "-c", line],
            cwd=self.work, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def finish(self, call: subprocess.Popen[str], line: str, gives_up: bool) -> list[str]:
        try:
            out, err = call.communicate(timeout=CALL_S)
        finally:
            call.kill()  # gone by now, unless it ran past CALL_S
        expected = GAVE_UP if gives_up else 0
        assert call.returncode == expected, f"{line!r} exited {call.returncode}: {err}"
        return out.splitlines()

    def start(self, module: str, args: list[str]) -> None:
        """A ``hangup-*`` line, started as the reader leaves it running (on ephemeral ports,
        mapped from the ones the page names)."""
        proc = start(module, [*args, *PORT_FLAGS[module]], self.work / module, timeout=CALL_S)
        self.stack.callback(proc.terminate)
        self.started[module] = proc
        ports = {"http": "8080", "grpc": "8081", "admin": "9090"}
        if module == "gateway_server":
            ports = {"http": "8000", "grpc": "8001"}
        self.addresses |= {port: proc.listeners[name] for name, port in ports.items()}

    def resolved(self, args: list[str]) -> list[str]:
        """``args``, each naming a file the page wrote made a path to it."""
        return [str(self.work / a) if (self.work / a).is_file() else a for a in args]

    def wait_held(self, calls: int) -> None:
        """Until the sidecar holds ``calls`` calls: a reader types the next command later."""
        admin = self.started["proxy"].url("admin")

        def held() -> bool:
            return metric_sum(admin, "hangup_proxy_inflight_requests") >= calls

        poll_until(held, CALL_S, "the sidecar to hold the call in the background", interval=0.05)


def matches(expected: str, printed: str) -> bool:
    """``printed`` is ``expected``, a ``...`` in it standing for anything."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


def check_output(block: Block, printed: list[str], session: Session) -> None:
    lines = [session.mapped(line) for line in block.text.splitlines() if line.strip()]
    missing = [e for e in lines if not any(matches(e, p) for p in printed)]
    assert not missing, f"the page shows {missing}; the commands printed:\n" + "\n".join(printed)


@contextlib.contextmanager
def reading(
    page: str, work: Path, addresses: dict[str, str], words: dict[str, str]
) -> Iterator[Walk]:
    """A reader going through ``page``: its blocks in order (see :class:`Walk`)."""
    if shutil.which("curl") is None:
        raise Unavailable(
            "the start pages call with curl: install curl (Debian: apt-get install curl)"
        )
    with contextlib.ExitStack() as stack:
        session = Session(work, dict(addresses), words, stack)
        yield Walk(session, blocks(page))


@dataclass
class Walk:
    session: Session
    todo: list[Block]

    def server(self) -> list[str]:
        """The next block, the reader's own server: its command line."""
        block = self.todo.pop(0)
        assert block.kind == "server", block
        (line,) = block.lines()
        return self.session.resolved(shlex.split(self.session.mapped(line), comments=True))

    def run(self) -> list[str]:
        """The next run block, checked against the output block after it if the page shows
        one; what it printed."""
        block = self.todo.pop(0)
        assert block.kind == "run", block
        printed = self.session.run(block)
        if self.todo and self.todo[0].kind == "output":
            check_output(self.todo.pop(0), printed, self.session)
        return printed

    @property
    def started(self) -> dict[str, Process]:
        return self.session.started
