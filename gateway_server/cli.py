"""``hangup-gateway`` (also ``python -m gateway_server``).

``hangup-gateway [options]`` serves; ``hangup-gateway make-tiny-model DIR`` writes a tiny
Llama-style model with random weights and a locally trained tokenizer (tests, demos).
"""

from __future__ import annotations

import asyncio
import sys
from importlib import import_module
from typing import Any

from prometheus_client import disable_created_metrics

from gateway_server.config import from_args
from gateway_server.engine.base import EngineError
from gateway_server.server import serve
from gateway_server.siblings.processes import ApiProcess, Supervisor
from hangup_contract.runtime import logs
from hangup_contract.runtime.options import ConfigError
from hangup_contract.runtime.supervision import supervised_signals


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make-tiny-model"]:
        tiny: Any = import_module("gateway_server.engine.vllm.tiny_model")
        sys.exit(tiny.main(argv[1:]))
    try:
        config = from_args(argv)
    except ConfigError as exc:
        sys.exit(f"hangup-gateway: {exc}")
    api_process = ApiProcess.from_environ(config)
    logs.setup(config.log_level, None if api_process is None else {"api_process": api_process.slot})
    if config.api_processes > 1 and api_process is None:
        asyncio.run(_supervise(Supervisor(config, argv)))
        return
    # Process-wide: the *_created series double every counter's series count for no reader.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(config, api_process))
    except EngineError as exc:
        sys.exit(f"hangup-gateway: {exc}")
    except OSError as exc:  # a port in use, an address not on this host
        sys.exit(f"hangup-gateway: cannot listen: {exc}")


async def _supervise(supervisor: Supervisor) -> None:
    stop, hurry = asyncio.Event(), asyncio.Event()
    supervised_signals(stop, hurry)
    try:
        await supervisor.serve(stop, hurry)
    except (RuntimeError, OSError) as exc:  # a process that could not start, a port in use
        sys.exit(f"hangup-gateway: {exc}")


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return None
    return uvloop.new_event_loop
