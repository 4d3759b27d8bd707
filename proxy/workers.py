"""``--workers N`` (N > 1): a supervisor process and N worker processes sharing the ports.

Each worker is the one-process proxy (:class:`proxy.server.Server`) without an admin listener.
Its HTTP listener is the supervisor's socket, shared by every worker, from which a worker takes a
connection while it holds no more than the least loaded of the others
(:mod:`hangup_contract.runtime.shared_listener`: connections follow load, and a worker that
stalls or dies holds or resets none that it had not taken); its gRPC listener binds the port its
siblings bind (``SO_REUSEPORT``: the kernel spreads new connections). A call, its hang-up and
its explicit cancel all live in the worker that accepted its connection, and limits
(``--max-concurrent-streams``, ``--max-connections``, ``--cancel-concurrency``, the memories of
ids) apply per worker. Only questions about ids cross: the proxy's own cancel by id, and with
``--trust-client-request-id`` whether another worker holds a call's id; the worker asks the
others over Unix sockets in the supervisor's private directory (``proxy.calls.siblings``;
``HANGUP_PROXY_WORKERS`` in each worker's environment says how many there are).

The supervisor relays nothing. It

- opens the HTTP listening socket and reserves the gRPC port (a socket bound with
  ``SO_REUSEPORT``, never listening: port 0 becomes one ephemeral port every worker shares) and
  starts the workers: ``python -m proxy`` with its own
  flags and environment, the ports, a ready file each, ``HANGUP_PROXY_WORKER_OF`` and
  ``HANGUP_PROXY_WORKER`` set (each of a worker's log lines carries ``"worker": <0..N-1>``);
- serves the admin listener: ``/metrics`` is every worker's metrics summed (prometheus_client's
  multiprocess mode, files in a private directory: counters and histograms keep what workers
  that died had counted, in-flight gauges sum the live workers; a file not readable yet, as a
  worker starts, is skipped for that scrape and counted in
  ``hangup_proxy_metrics_files_skipped_total``) and its own (``hangup_proxy_workers``,
  ``hangup_proxy_worker_restarts_total``); ``/readyz`` is 200 while
  every worker serves and it is not draining; ``/healthz`` 503 once no worker has served for
  ``NONE_SERVING_LIMIT`` seconds (they keep exiting: only a new container may help);
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
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.registry import Collector

from hangup_contract.runtime.process_files import ProcessFiles
from hangup_contract.runtime.shared_listener import SharedListener
from hangup_contract.runtime.supervision import Children, listening
from proxy.admin import AdminSite
from proxy.calls.siblings import COUNT_ENV
from proxy.config import Config
from proxy.metrics import SupervisorMetrics

log = logging.getLogger("hangup.proxy.workers")

WORKER_ENV = "HANGUP_PROXY_WORKER_OF"  # in a worker's environment: its supervisor's pid
SLOT_ENV = "HANGUP_PROXY_WORKER"  # and which worker it is (0..N-1), in each of its log lines
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
_READY_WAIT = 60.0  # seconds a worker may take to serve
_EXIT_SLACK = 15.0  # seconds past a worker's own drain and cancel deadlines before SIGKILL
NONE_SERVING_LIMIT = 60.0
"""Seconds with no worker serving (each restarted one exiting again) before ``/healthz`` answers
503 and Kubernetes restarts the container (a worker starts in about a second)."""


def supervisor_pid() -> int | None:
    """The supervisor's pid when this process is a worker, else None."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value else None


def worker_slot() -> int | None:
    """Which worker this process is (0..N-1), when it is one."""
    value = os.environ.get(SLOT_ENV)
    return int(value) if value and supervisor_pid() is not None else None


def worker_of() -> tuple[Path, int, int] | None:
    """When this process is a worker: its supervisor's private directory, its slot and how
    many workers there are (what ``proxy.server.WorkerOf`` holds)."""
    slot = worker_slot()
    directory, count = os.environ.get(METRICS_ENV), os.environ.get(COUNT_ENV)
    if slot is None or not directory or not count:
        return None
    return Path(directory), slot, int(count)


class _Summed(Collector):
    """The workers' metrics and the supervisor's own as one exposition (a family both have,
    such as connections closed on the admin listener, appears once)."""

    def __init__(self, workers: ProcessFiles, own: CollectorRegistry) -> None:
        self._workers = workers
        self._own = own

    def collect(self) -> Iterable[Any]:
        collected = self._workers.collect()
        families = {family.name: family for family in collected}
        for family in self._own.collect():
            if family.name in families:
                families[family.name].samples.extend(family.samples)
            else:
                families[family.name] = family
        return families.values()


class Supervisor:
    def __init__(
        self, config: Config, argv: Sequence[str], none_serving_limit: float = NONE_SERVING_LIMIT
    ) -> None:
        self.config = config
        self.none_serving_limit = none_serving_limit
        self._argv = list(argv)
        self._dir = Path(tempfile.mkdtemp(prefix="hangup-proxy-"))
        self._own = CollectorRegistry()
        self.registry = CollectorRegistry()
        self._metrics = SupervisorMetrics(self._own)
        skipped = self._metrics.files_skipped
        workers = ProcessFiles(self._dir, lambda _: skipped.inc())
        self.registry.register(_Summed(workers, self._own))
        self._admin = AdminSite(
            config, self.registry, self._ready, self._metrics.connections_closed, self.live
        )
        self._none_serving_since: float | None = time.monotonic()
        self._ports = (0, 0)
        self._http: SharedListener | None = None
        self.children = Children(
            "worker",
            config.workers,
            self._command,
            self._dir,
            ready_wait=_READY_WAIT,
            on_change=self.serving_changed,
            on_exit=self._exited,
        )

    def serving_changed(self, serving: int) -> None:
        """``serving`` workers serve now (the children's callback)."""
        self._metrics.workers.set(serving)
        if serving:
            self._none_serving_since = None
        elif self._none_serving_since is None:
            self._none_serving_since = time.monotonic()

    def live(self) -> bool:
        """Alive unless no worker has served for ``none_serving_limit`` seconds."""
        since = self._none_serving_since
        return since is None or time.monotonic() - since <= self.none_serving_limit

    def _ready(self) -> bool:
        return not self.children.draining and len(self.children.serving) == self.config.workers

    def _command(self, slot: int, ready: Path) -> tuple[Sequence[str], Mapping[str, str]]:
        env = {
            **os.environ,
            WORKER_ENV: str(os.getpid()),
            SLOT_ENV: str(slot),
            COUNT_ENV: str(self.config.workers),
            METRICS_ENV: str(self._dir),
            **(self._http.child_env(slot) if self._http is not None else {}),
        }
        argv = [
            "-m",
            "proxy",
            *self._argv,
            "--http-port",
            str(self._ports[0]),
            "--grpc-port",
            str(self._ports[1]),
            "--workers",
            "1",
            "--ready-file",
            str(ready),
        ]
        return argv, env

    def _exited(self, slot: int, pid: int, code: int | None) -> None:
        mark_process_dead(pid, str(self._dir))  # type: ignore[no-untyped-call]
        if self._http is not None:
            self._http.exited(slot)
        self._metrics.restarts.inc()
        log.warning(
            "worker exited; starting it again",
            extra={"fields": {"worker": slot, "pid": pid, "exit": code}},
        )

    async def serve(self, stop: asyncio.Event, hurry: asyncio.Event) -> None:
        config = self.config
        with listening(config.host, config.http_port, config.grpc_port, self.children) as ports:
            http = self._http = ports.http
            self._ports = (http.port, ports.grpc)
            try:
                admin = await self._admin.start()
                addresses = {
                    "http": f"{config.host}:{self._ports[0]}",
                    "grpc": f"{config.host}:{self._ports[1]}",
                    "admin": admin,
                }
                slack = config.cancel_deadline + _EXIT_SLACK
                await self.children.serve(
                    stop,
                    hurry,
                    ready_file=config.ready_file,
                    addresses=addresses,
                    announce=(log, {"listeners": addresses, "workers": config.workers}),
                    drain_within=config.drain_timeout + slack,
                    on_drain=http.stop_listening,
                    after_hurry=slack,
                )
            finally:
                await self._admin.close()
                shutil.rmtree(self._dir, ignore_errors=True)
                log.info("stopped")
