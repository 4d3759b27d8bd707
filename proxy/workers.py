"""``--workers N`` (N > 1): a supervisor process and N worker processes sharing the ports.

Each worker is the one-process proxy (:class:`proxy.server.Server`) without an admin listener;
its HTTP and gRPC listeners bind the same ports as its siblings' (``SO_REUSEPORT``: the kernel
spreads new connections over the workers). A call, its hang-up and its explicit cancel all live
in the worker that accepted its connection: nothing about a call crosses processes, and limits
(``--max-concurrent-streams``, ``--max-connections``, ``--cancel-concurrency``) apply per worker.

The supervisor relays nothing. It

- reserves the ports (a socket bound with ``SO_REUSEPORT``, never listening: port 0 becomes one
  ephemeral port every worker shares) and starts the workers: ``python -m proxy`` with its own
  flags and environment, the ports, a ready file each, ``HANGUP_PROXY_WORKER_OF`` and
  ``HANGUP_PROXY_WORKER`` set (each of a worker's log lines carries ``"worker": <0..N-1>``);
- serves the admin listener: ``/metrics`` is every worker's metrics summed (prometheus_client's
  multiprocess mode, files in a private directory: counters and histograms keep what workers
  that died had counted, in-flight gauges sum the live workers) and its own
  (``hangup_proxy_workers``, ``hangup_proxy_worker_restarts_total``); ``/readyz`` is 200 while
  every worker serves and it is not draining;
- writes the ready file once every worker serves;
- replaces a worker that exits (a warning naming its exit status, the restart counted), at most
  once a second per worker;
- on SIGTERM: ``/readyz`` 503, SIGTERM to every worker (each drains as the one-process proxy
  does: ``--drain-timeout``, then cancels with reason ``shutdown``), waits for them, exits. A
  second signal is passed on (the workers stop waiting for their calls).

A worker whose supervisor is gone (killed with SIGKILL) sees its stdin, a pipe the supervisor
held, close, and drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from hangup_contract.runtime.files import write_ready_file
from proxy.admin import AdminSite
from proxy.config import Config

log = logging.getLogger("hangup.proxy.workers")

WORKER_ENV = "HANGUP_PROXY_WORKER_OF"  # in a worker's environment: its supervisor's pid
SLOT_ENV = "HANGUP_PROXY_WORKER"  # and which worker it is (0..N-1), in each of its log lines
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
_RESTART_EVERY = 1.0  # seconds between two starts of one worker, at least
_READY_WAIT = 60.0  # seconds a worker may take to serve
_EXIT_SLACK = 15.0  # seconds past a worker's own drain and cancel deadlines before SIGKILL


def supervisor_pid() -> int | None:
    """The supervisor's pid when this process is a worker, else None."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value else None


def worker_slot() -> int | None:
    """Which worker this process is (0..N-1), when it is one."""
    value = os.environ.get(SLOT_ENV)
    return int(value) if value and supervisor_pid() is not None else None


def _reserve(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class _Summed(Collector):
    """The workers' metrics and the supervisor's own as one exposition (a family both have,
    such as connections closed on the admin listener, appears once)."""

    def __init__(self, workers: MultiProcessCollector, own: CollectorRegistry) -> None:
        self._workers = workers
        self._own = own

    def collect(self) -> Iterable[Any]:
        collected = self._workers.collect()  # type: ignore[no-untyped-call]
        families = {family.name: family for family in collected}
        for family in self._own.collect():
            if family.name in families:
                families[family.name].samples.extend(family.samples)
            else:
                families[family.name] = family
        return families.values()


class Supervisor:
    def __init__(self, config: Config, argv: Sequence[str]) -> None:
        self.config = config
        self._argv = list(argv)
        self._dir = Path(tempfile.mkdtemp(prefix="hangup-proxy-"))
        self._own = CollectorRegistry()
        self.registry = CollectorRegistry()
        workers = MultiProcessCollector(None, path=str(self._dir))  # type: ignore[no-untyped-call]
        self.registry.register(_Summed(workers, self._own))
        self._live = Gauge("hangup_proxy_workers", "Worker processes serving.",
                           registry=self._own)  # fmt: skip
        self._restarts = Counter("hangup_proxy_worker_restarts",
                                 "Worker processes that exited and were started again.",
                                 registry=self._own)  # fmt: skip
        closed = Counter("hangup_proxy_connections_closed", "Client connections the proxy closed "
                         "or refused to hold, by listener and why.", ["listener", "reason"],
                         registry=self._own)  # fmt: skip
        self._admin = AdminSite(config, self.registry, self._ready, closed)
        self._workers: dict[int, asyncio.subprocess.Process] = {}
        self._serving: set[int] = set()
        self._draining = False

    def _ready(self) -> bool:
        return not self._draining and len(self._serving) == self.config.workers

    async def serve(self, stop: asyncio.Event, hurry: asyncio.Event) -> None:
        config = self.config
        http = _reserve(config.host, config.http_port)
        grpc = _reserve(config.host, config.grpc_port)
        ports = (http.getsockname()[1], grpc.getsockname()[1])
        keepers: list[asyncio.Task[None]] = []
        try:
            admin = await self._admin.start()
            keepers = [asyncio.create_task(self._keep(slot, ports)) for slot in
                       range(config.workers)]  # fmt: skip
            await self._all_serving(keepers)
            addresses = {"http": f"{config.host}:{ports[0]}",
                         "grpc": f"{config.host}:{ports[1]}", "admin": admin}  # fmt: skip
            if config.ready_file is not None:
                write_ready_file(config.ready_file, addresses)
            log.info("serving", extra={"fields": {"listeners": addresses,
                                                  "workers": config.workers}})  # fmt: skip
            await stop.wait()
            await self._drain(hurry)
        finally:
            for keeper in keepers:
                keeper.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            await self._kill_all()
            await self._admin.close()
            http.close()
            grpc.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            log.info("stopped")

    async def _all_serving(self, keepers: list[asyncio.Task[None]]) -> None:
        """Wait until every worker serves; a worker that cannot start ends the proxy."""
        deadline = time.monotonic() + _READY_WAIT
        while len(self._serving) < self.config.workers:
            failed = [k for k in keepers if k.done()]
            if failed:
                failed[0].result()  # raises why
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not serving within {_READY_WAIT:g} s")
            await asyncio.wait(keepers, timeout=0.05)

    async def _keep(self, slot: int, ports: tuple[int, int]) -> None:
        """Run worker ``slot`` for as long as the proxy serves, starting it again if it exits."""
        first = True
        while not self._draining:
            started = time.monotonic()
            worker = await self._start(slot, ports, first)
            code = await worker.wait()
            self._serving.discard(slot)
            self._live.set(len(self._serving))
            mark_process_dead(worker.pid, str(self._dir))  # type: ignore[no-untyped-call]
            if self._draining:
                return
            self._restarts.inc()
            log.warning("worker exited; starting it again", extra={"fields": {
                "worker": slot, "pid": worker.pid, "exit": code}})  # fmt: skip
            first = False
            await asyncio.sleep(max(0.0, started + _RESTART_EVERY - time.monotonic()))

    async def _start(
        self, slot: int, ports: tuple[int, int], first: bool
    ) -> asyncio.subprocess.Process:
        ready = self._dir / f"worker-{slot}.ready.json"
        ready.unlink(missing_ok=True)
        env = {**os.environ, WORKER_ENV: str(os.getpid()), SLOT_ENV: str(slot),
               METRICS_ENV: str(self._dir)}  # fmt: skip
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *self._argv,
            "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--workers", "1",
            "--ready-file", str(ready), env=env, stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._workers[slot] = worker
        deadline = time.monotonic() + _READY_WAIT
        while not ready.exists():
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(worker.wait(), 0.05)
                if first:
                    raise RuntimeError(f"worker {slot} exited with {code} before serving")
                return worker  # _keep counts it and starts it again
            if time.monotonic() > deadline:
                worker.kill()
                raise RuntimeError(f"worker {slot} not serving within {_READY_WAIT:g} s")
        json.loads(ready.read_text())  # complete: written atomically
        self._serving.add(slot)
        self._live.set(len(self._serving))
        return worker

    async def _drain(self, hurry: asyncio.Event) -> None:
        self._draining = True
        log.info("draining", extra={"fields": {"workers": len(self._workers)}})
        self._signal(signal.SIGTERM)
        exits = [asyncio.ensure_future(w.wait()) for w in self._workers.values()]
        exited: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*exits))
        hurried: asyncio.Future[Any] = asyncio.ensure_future(hurry.wait())
        limit = self.config.drain_timeout + self.config.cancel_deadline + _EXIT_SLACK
        done, _ = await asyncio.wait([exited, hurried], timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if hurried in done:
            self._signal(signal.SIGTERM)  # a second signal: stop waiting for calls
            await asyncio.wait(exits, timeout=self.config.cancel_deadline + _EXIT_SLACK)
        hurried.cancel()

    def _signal(self, signum: int) -> None:
        for worker in self._workers.values():
            if worker.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.send_signal(signum)

    async def _kill_all(self) -> None:
        for worker in self._workers.values():
            if worker.returncode is None:
                log.warning("worker did not exit: killing it", extra={"fields": {
                    "pid": worker.pid}})  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    worker.kill()
                await worker.wait()


async def watch_supervisor(stop: asyncio.Event) -> None:
    """In a worker: set ``stop`` (drain) once the supervisor is gone. A worker's stdin is a pipe
    its supervisor holds open and never writes: end of file means the supervisor exited."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    log.warning("supervisor gone: draining")
    stop.set()
