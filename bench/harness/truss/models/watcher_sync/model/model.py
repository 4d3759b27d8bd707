"""A sync ``predict`` that works in steps of 20 ms and checks the event of Truss's disconnect
watcher (``request.state.watch_disconnect()``) before each."""

import time
from typing import Any

import fastapi
from model.record import NothingToLoad, Record, request_of

STEP_S = 0.02


class Model(NothingToLoad):
    def predict(self, inputs: Any, request: fastapi.Request) -> Any:
        request_id, steps = request_of(inputs, 50)
        record = Record("watcher_sync", request_id, steps)
        with request.state.watch_disconnect() as disconnected:
            for step in range(steps):
                if disconnected.is_set():
                    record.end("disconnected", step)
                    return {"id": request_id, "steps": step}
                time.sleep(STEP_S)
        record.end("finished", steps)
        return {"id": request_id, "steps": steps}
