"""Several processes of one server behind shared ports: what the proxy's ``--workers`` and the
gateway's ``--api-processes`` have in common.

A supervisor opens the HTTP listening socket every child inherits
(:mod:`hangup_contract.runtime.shared_listener`) and reserves the gRPC port (:func:`reserve_port`:
bound with ``SO_REUSEPORT``, never listening, so port 0 becomes one ephemeral port every child
shares), then :class:`Children` runs N copies of a command and keeps them running, and
:meth:`Children.serve` is the supervisor's life: start them, announce, wait, drain:

- a child is serving once it wrote its ready file; :meth:`Children.all_serving` waits for every
  child (a child that exits before serving the first time ends the server, naming it);
- a child that exits is started again, at most once a second per slot, and reported through
  ``on_exit`` (the caller counts and logs it);
- :meth:`Children.drain` sends SIGTERM to every child and waits for them (a second signal to the
  supervisor is passed on), :meth:`Children.kill_all` ends the ones that did not exit.

Each child's stdin is a pipe the supervisor holds and never writes: a child whose supervisor
died (SIGKILL) reads end of file and drains (:func:`watch_supervisor`).

Each child leads a process group of its own (in the supervisor's session), and once it has
exited whatever is left of that group is killed (SIGKILL) before the slot starts again: a
gateway API process that died leaves its vLLM engine processes orphaned, and they ignore
SIGTERM and would keep their GPU memory from the engines the next process starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangup_contract.runtime.files import write_ready_file
from hangup_contract.runtime.shared_listener import SharedListener, shared_listener

log = logging.getLogger("hangup.supervision")

RESTART_EVERY = 1.0  # seconds between two starts of one slot, at least

Command = Callable[[int, Path], tuple[Sequence[str], Mapping[str, str]]]
"""``(slot, ready file) -> (argv, environment)`` of the child in ``slot``."""


@dataclass(frozen=True)
class Ports:
    """What the children listen on: the shared HTTP socket, and the gRPC port each binds."""

    http: SharedListener
    grpc: int


@contextlib.contextmanager
def listening(host: str, http_port: int, grpc_port: int, children: Children) -> Iterator[Ports]:
    """The HTTP socket every child of ``children`` inherits (its board in their run directory)
    and the reserved gRPC port, held until the end."""
    with (
        shared_listener(host, http_port, children.count, children.run_dir) as http,
        reserve_port(host, grpc_port) as grpc,
    ):
        children.pass_fds = (http.fd,)
        yield Ports(http, grpc.getsockname()[1])


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``; keep it open while children serve."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Children:
    """``count`` child processes, each started by ``command`` and kept running."""

    def __init__(
        self,
        what: str,
        count: int,
        command: Command,
        run_dir: Path,
        *,
        ready_wait: float,
        on_change: Callable[[int], None] = lambda serving: None,
        on_exit: Callable[[int, int, int | None], None] = lambda slot, pid, code: None,
    ) -> None:
        self.what = what  # "worker", "API process": how log lines and errors name a child
        self.count = count
        self._command = command
        self.run_dir = run_dir
        self._ready_wait = ready_wait
        self._on_change = on_change
        self._on_exit = on_exit
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.serving: set[int] = set()
        self.draining = False
        self._keepers: list[asyncio.Task[None]] = []
        self.pass_fds: Sequence[int] = ()  # descriptors every child inherits (a shared listener)

    async def start(self) -> None:
        """Start every child; return once all serve. Raises RuntimeError naming a child that
        could not start."""
        self._keepers = [asyncio.create_task(self._keep(slot)) for slot in range(self.count)]
        deadline = time.monotonic() + self._ready_wait
        while len(self.serving) < self.count:
            failed = [k for k in self._keepers if k.done()]
            if failed:
                failed[0].result()  # raises why
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what}s not serving within {self._ready_wait:g} s")
            await asyncio.wait(self._keepers, timeout=0.05)

    async def serve(
        self,
        stop: asyncio.Event,
        hurry: asyncio.Event,
        *,
        ready_file: Path | None,
        addresses: Mapping[str, str],
        announce: tuple[logging.Logger, Mapping[str, object]],
        drain_within: float,
        after_hurry: float,
        on_drain: Callable[[], None] = lambda: None,
    ) -> None:
        """Start every child, write ``addresses`` to the ready file, log ``serving`` (with the
        logger and fields of ``announce``), wait for ``stop``, call ``on_drain``, then
        :meth:`drain`; the children that did not exit are killed on the way out, whatever
        happened."""
        try:
            await self.start()
            if ready_file is not None:
                write_ready_file(ready_file, addresses)
            logger, fields = announce
            logger.info("serving", extra={"fields": dict(fields)})
            await stop.wait()
            on_drain()
            await self.drain(hurry, drain_within, after_hurry)
        finally:
            await self.kill_all()

    async def _keep(self, slot: int) -> None:
        first = True
        while not self.draining:
            started = time.monotonic()
            child = await self._start(slot, first)
            code = await child.wait()
            _kill_group(child.pid)
            self.serving.discard(slot)
            self._on_change(len(self.serving))
            if self.draining:
                return
            self._on_exit(slot, child.pid, code)
            first = False
            await asyncio.sleep(max(0.0, started + RESTART_EVERY - time.monotonic()))

    async def _start(self, slot: int, first: bool) -> asyncio.subprocess.Process:
        ready = self.run_dir / f"{self.what.replace(' ', '-')}-{slot}.ready.json"
        ready.unlink(missing_ok=True)
        argv, env = self._command(slot, ready)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,
            pass_fds=self.pass_fds,
            process_group=0,  # a group of its own, in this session (a session of its own would
            # put it in a scheduler autogroup of its own: relayed streams came out in bursts)
        )
        self.processes[slot] = child
        deadline = time.monotonic() + self._ready_wait
        while not ready.exists():
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(child.wait(), 0.05)
                if first:
                    raise RuntimeError(f"{self.what} {slot} exited with {code} before serving")
                return child  # _keep reports it and starts it again
            if time.monotonic() > deadline:
                child.kill()
                raise RuntimeError(f"{self.what} {slot} not serving within {self._ready_wait:g} s")
        json.loads(ready.read_text())  # complete: written atomically
        self.serving.add(slot)
        self._on_change(len(self.serving))
        return child

    async def drain(self, hurry: asyncio.Event, limit: float, after_hurry: float) -> None:
        """SIGTERM every child and wait up to ``limit`` s for them to exit; when ``hurry`` is set
        meanwhile, SIGTERM them again (they stop waiting for calls) and wait ``after_hurry`` s."""
        self.draining = True
        log.info("draining", extra={"fields": {"processes": len(self.processes)}})
        self.signal(signal.SIGTERM)
        exits = [asyncio.ensure_future(p.wait()) for p in self.processes.values()]
        exited: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*exits))
        hurried: asyncio.Future[Any] = asyncio.ensure_future(hurry.wait())
        done, _ = await asyncio.wait(
            [exited, hurried], timeout=limit, return_when=asyncio.FIRST_COMPLETED
        )
        if hurried in done:
            self.signal(signal.SIGTERM)
            await asyncio.wait(exits, timeout=after_hurry)
        hurried.cancel()

    def signal(self, signum: int) -> None:
        for child in self.processes.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)

    async def kill_all(self) -> None:
        """Stop keeping children, and kill the ones still running."""
        self.draining = True
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        for child in self.processes.values():
            if child.returncode is None:
                log.warning(
                    f"{self.what} did not exit: killing it", extra={"fields": {"pid": child.pid}}
                )
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
            _kill_group(child.pid)


def _kill_group(leader: int) -> None:
    """SIGKILL what is left of the process group ``leader`` led (it has exited)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)


def supervised_signals(stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """SIGTERM/SIGINT: the first sets ``stop`` (drain), the next ones ``hurry``."""

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)


async def watch_supervisor(stop: Callable[[], None]) -> None:
    """In a child: call ``stop`` (drain) once the supervisor is gone. A child's stdin is a pipe
    its supervisor holds open and never writes: end of file means the supervisor exited."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    log.warning("supervisor gone: draining")
    stop()
