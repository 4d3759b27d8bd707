"""A streaming ``predict`` that yields a line every 20 ms and never asks whether its client is
still there: what a hang-up cannot stop, through a proxy or not."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from model.record import NothingToLoad, Record, request_of

STEP_S = 0.02


class Model(NothingToLoad):
    async def predict(self, inputs: Any) -> AsyncIterator[str]:
        request_id, steps = request_of(inputs, 50)
        record = Record("ignoring_stream", request_id, steps)
        step = 0
        try:
            for step in range(steps):
                yield f"{request_id} {step}\n"
                await asyncio.sleep(STEP_S)
            record.end("finished", steps)
        finally:
            record.end("closed", step)
