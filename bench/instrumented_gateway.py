"""The gateway with a simulated engine that records when each abort hit a step boundary.

For benchmarks only: ``python -m bench.instrumented_gateway [gateway options] --boundary-log F``
runs the normal gateway, and on exit writes one JSON line per aborted request to ``F``:
``{"id", "boundary": when the step boundary applied it, "confirmed": when the gateway's
awaiting code resumed with the confirmation}`` (``time.monotonic()``).
CLOCK_MONOTONIC is shared by processes on one host, so a client can compare its own clock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from gateway_server.cli import configure_logging
from gateway_server.config import from_args
from gateway_server.engine.sim import SimConfig, SimulatedEngine
from gateway_server.server import GatewayServer


class BoundaryRecordingSimEngine(SimulatedEngine):
    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.boundaries: dict[str, float] = {}
        self.confirmed: dict[str, float] = {}

    def _resolve_aborts(self) -> bool:
        now = time.monotonic()
        for request_id in self._aborts:
            self.boundaries.setdefault(request_id, now)
        return super()._resolve_aborts()

    async def abort(self, request_id: str) -> None:
        await super().abort(request_id)
        self.confirmed.setdefault(request_id, time.monotonic())  # the gateway holds the answer


async def run(argv: list[str], log_path: Path) -> None:
    config = from_args(argv)
    configure_logging("WARNING")
    engines = [BoundaryRecordingSimEngine(config.sim) for _ in range(config.workers)]
    server = GatewayServer(config, engines=list(engines))
    await server.start()
    try:
        await server.serve_until_stopped()
    finally:
        with log_path.open("w") as out:
            for engine in engines:
                for request_id, at in engine.boundaries.items():
                    confirmed = engine.confirmed.get(request_id)
                    record = {"id": request_id, "boundary": at, "confirmed": confirmed}
                    out.write(json.dumps(record) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    i = argv.index("--boundary-log")
    log_path = Path(argv[i + 1])
    del argv[i : i + 2]
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run(argv, log_path))


if __name__ == "__main__":
    main()
