"""``hangup-proxy`` (also ``python -m proxy``): flags and environment → ``Config`` → ``Server``."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal
import sys
from collections.abc import Sequence

from hangup_contract.runtime import logs
from hangup_contract.runtime.options import ConfigError
from hangup_contract.runtime.supervision import supervised_signals, watch_supervisor
from proxy.config import build_config
from proxy.server import Server, WorkerOf
from proxy.workers import Supervisor, supervisor_pid, worker_of, worker_slot


async def _run(server: Server) -> None:
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            server.hurry()  # a second signal: stop waiting for calls to finish
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    watching = asyncio.create_task(watch_supervisor(stop.set)) if supervisor_pid() else None
    try:
        await server.serve(stop)
    finally:
        if watching is not None:
            watching.cancel()


async def _supervise(supervisor: Supervisor) -> None:
    stop, hurry = asyncio.Event(), asyncio.Event()
    supervised_signals(stop, hurry)
    await supervisor.serve(stop, hurry)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = build_config(args, os.environ)
    except ConfigError as exc:
        sys.exit(f"hangup-proxy: {exc}")
    slot = worker_slot()
    logs.setup(config.log_level, None if slot is None else {"worker": slot})
    if config.workers > 1:
        # Relays nothing itself: no gc.freeze, and its event loop is idle.
        asyncio.run(_supervise(Supervisor(config, args)))
        return
    worker = None
    if supervisor_pid() is not None:
        config = dataclasses.replace(config, reuse_port=True)
        found = worker_of()
        worker = WorkerOf(*found) if found is not None else None
    # What is loaded by now lives as long as the process (~44k objects, nearly all modules): out
    # of the collector's sight, a full collection no longer stops every relayed stream to walk
    # it (10-20 ms on two cores).
    gc.collect()
    gc.freeze()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(_run(Server(config, worker_of=worker)))
    else:
        uvloop.run(_run(Server(config, worker_of=worker)))
