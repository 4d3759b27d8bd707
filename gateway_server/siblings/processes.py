"""``--api-processes P`` (P > 1): a supervisor and P API processes sharing the ports.

Each API process is the one-process gateway (:class:`gateway_server.server.GatewayServer`) over
its share of the engine workers: process k of P runs workers ``k*W//P`` to ``(k+1)*W//P - 1``
(worker labels and log fields keep their gateway-wide index). Its HTTP listener is the
supervisor's socket, shared by every API process, from which a process takes a connection while
it holds no more than the least loaded of the others
(:mod:`hangup_contract.runtime.shared_listener`: connections follow load, and a process that
stalls or dies holds or resets none that it had not taken); its gRPC listener binds the port its
siblings bind (``SO_REUSEPORT``: the kernel spreads new connections, but a gRPC client keeps
one HTTP/2 connection for all its calls, so one client's calls all reach one process). With
``--grpc-process-ports`` each process also serves gRPC on a port of its own, reserved by the
supervisor for the gateway's life (a restarted process binds it again): a client that spreads
its calls over all of them (the proxy, given them all in ``--upstream-grpc``) uses every
process. A request runs on a worker of the process that accepted it. How cancels, duplicate ids,
``GET /v2/requests`` and ``/metrics`` work across processes: :mod:`gateway_server.siblings`.

The supervisor serves nothing. It

- opens the HTTP listening socket, reserves the gRPC port, and starts the processes
  (``python -m gateway_server`` with its own flags, the ports, a ready file each;
  ``HANGUP_GATEWAY_API_PROCESS_OF`` and ``HANGUP_GATEWAY_API_PROCESS`` in the environment, and
  every log line of process k carries ``"api_process": k``), with a private run directory (the
  siblings' sockets, prometheus_client's multiprocess files, the shared listener's board);
- writes the ready file once every process serves;
- starts a process that exited again (a warning naming its exit status; the new process counts
  ``hangup_gateway_api_process_restarts_total``). The calls it ran ended with it: their clients'
  connections closed (through the proxy: a 502 if no answer had begun, else a cut stream); what is
  left of its process group (vLLM engine processes) is killed. Its engine workers
  start again with it; meanwhile the other processes take the new connections;
- on SIGTERM: SIGTERM to every process (each drains as the one-process gateway does), waits for
  them, exits. A second signal is passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway_server.config import GatewayConfig
from hangup_contract.runtime.shared_listener import SharedListener
from hangup_contract.runtime.supervision import Children, listening, reserve_port

log = logging.getLogger("hangup.gateway.processes")

SUPERVISOR_ENV = "HANGUP_GATEWAY_API_PROCESS_OF"  # in an API process: its supervisor's pid
SLOT_ENV = "HANGUP_GATEWAY_API_PROCESS"  # which one it is, 0..P-1
RESTARTED_ENV = "HANGUP_GATEWAY_API_PROCESS_RESTARTED"  # "1" when started again after an exit
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # the run directory
_READY_WAIT = 1800.0  # seconds an API process may take to serve (loading its engines)
_EXIT_SLACK = 30.0  # seconds past the drain timeout for cancels and engine shutdown


@dataclass(frozen=True, slots=True)
class ApiProcess:
    """Who this process is, when it is one of several API processes."""

    slot: int
    count: int
    run_dir: Path
    restarted: bool

    @classmethod
    def from_environ(cls, config: GatewayConfig) -> ApiProcess | None:
        if not os.environ.get(SUPERVISOR_ENV) or config.api_processes < 2:
            return None
        return cls(
            int(os.environ[SLOT_ENV]),
            config.api_processes,
            Path(os.environ[METRICS_ENV]),
            os.environ.get(RESTARTED_ENV) == "1",
        )

    def workers(self, total: int) -> range:
        """The gateway-wide indices of this process's engine workers."""
        return range(self.slot * total // self.count, (self.slot + 1) * total // self.count)


class Supervisor:
    def __init__(self, config: GatewayConfig, argv: Sequence[str]) -> None:
        self.config = config
        self._argv = list(argv)
        self._dir = Path(tempfile.mkdtemp(prefix="hangup-gateway-"))
        self._ports = (0, 0)
        self._own_grpc: list[int] = []  # API process k's own gRPC port (--grpc-process-ports)
        self._restarted: set[int] = set()
        self._http: SharedListener | None = None
        self.children = Children(
            "API process",
            config.api_processes,
            self._command,
            self._dir,
            ready_wait=_READY_WAIT,
            on_exit=self._exited,
        )

    def _command(self, slot: int, ready: Path) -> tuple[Sequence[str], Mapping[str, str]]:
        env = {
            **os.environ,
            SUPERVISOR_ENV: str(os.getpid()),
            SLOT_ENV: str(slot),
            METRICS_ENV: str(self._dir),
            RESTARTED_ENV: str(int(slot in self._restarted)),
            **(self._http.child_env(slot) if self._http is not None else {}),
        }
        argv = [
            "-m",
            "gateway_server",
            *self._argv,
            "--http-port",
            str(self._ports[0]),
            "--grpc-port",
            str(self._ports[1]),
            "--ready-file",
            str(ready),
        ]
        if self._own_grpc:
            argv += ["--grpc-process-ports", str(self._own_grpc[slot])]
        return argv, env

    def _exited(self, slot: int, pid: int, code: int | None) -> None:
        self._restarted.add(slot)
        if self._http is not None:
            self._http.exited(slot)
        log.warning(
            "API process exited; starting it again",
            extra={"fields": {"api_process": slot, "pid": pid, "exit": code}},
        )

    async def serve(self, stop: asyncio.Event, hurry: asyncio.Event) -> None:
        config = self.config
        with (
            listening(config.host, config.http_port, config.grpc_port, self.children) as ports,
            contextlib.ExitStack() as own,
        ):
            http = self._http = ports.http
            self._ports = (http.port, ports.grpc)
            if (first := config.grpc_process_ports) is not None:  # reserved for every restart
                for slot in range(config.api_processes):
                    port = 0 if first == 0 else first + slot
                    try:
                        sock = own.enter_context(reserve_port(config.host, port))
                    except OSError as exc:
                        raise OSError(
                            f"--grpc-process-ports: API process {slot}'s gRPC port "
                            f"{config.host}:{port}: {exc.strerror or exc}"
                        ) from exc
                    self._own_grpc.append(sock.getsockname()[1])
            try:
                addresses = {
                    "http": f"{config.host}:{self._ports[0]}",
                    "grpc": f"{config.host}:{self._ports[1]}",
                }
                if self._own_grpc:
                    addresses["grpc_processes"] = ",".join(
                        f"{config.host}:{port}" for port in self._own_grpc
                    )
                await self.children.serve(
                    stop,
                    hurry,
                    ready_file=config.ready_file,
                    addresses=addresses,
                    announce=(log, {**addresses, "api_processes": config.api_processes}),
                    drain_within=config.drain_timeout + _EXIT_SLACK,
                    on_drain=http.stop_listening,
                    after_hurry=_EXIT_SLACK,
                )
            finally:
                shutil.rmtree(self._dir, ignore_errors=True)
                log.info("stopped")
