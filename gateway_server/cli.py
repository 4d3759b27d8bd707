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
from hangup_contract.runtime import logs
from hangup_contract.runtime.options import ConfigError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make-tiny-model"]:
        tiny: Any = import_module("gateway_server.tiny_model")
        sys.exit(tiny.main(argv[1:]))
    try:
        config = from_args(argv)
    except ConfigError as exc:
        sys.exit(f"hangup-gateway: {exc}")
    logs.setup(config.log_level)
    # Process-wide: the *_created series double every counter's series count for no reader.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(config))
    except EngineError as exc:
        sys.exit(f"hangup-gateway: {exc}")
    except OSError as exc:  # a port in use, an address not on this host
        sys.exit(f"hangup-gateway: cannot listen: {exc}")


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return None
    return uvloop.new_event_loop
