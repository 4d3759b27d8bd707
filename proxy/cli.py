"""``hangup-proxy`` (also ``python -m proxy``): flags and environment → ``Config`` → ``Server``."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Sequence

from hangup_contract.runtime import logs
from hangup_contract.runtime.options import ConfigError
from proxy.config import build_config
from proxy.server import Server


async def _run(server: Server) -> None:
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            server.hurry()  # a second signal: stop waiting for calls to finish
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    await server.serve(stop)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = build_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        sys.exit(f"hangup-proxy: {exc}")
    logs.setup(config.log_level)
    # What is loaded by now lives as long as the process (~44k objects, nearly all modules): out
    # of the collector's sight, a full collection no longer stops every relayed stream to walk
    # it (10-20 ms on two cores).
    gc.collect()
    gc.freeze()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(_run(Server(config)))
    else:
        uvloop.run(_run(Server(config)))
