"""A streaming ``predict``: an async generator that yields a line every 20 ms and asks
``request.is_disconnected()`` before each."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import fastapi
from model.record import NothingToLoad, Record, request_of

STEP_S = 0.02


class Model(NothingToLoad):
    async def predict(self, inputs: Any, request: fastapi.Request) -> AsyncIterator[str]:
        request_id, steps = request_of(inputs, 50)
        record = Record("polling_stream", request_id, steps)
        step = 0
        try:
            for step in range(steps):
                if await request.is_disconnected():
                    record.end("disconnected", step)
                    return
                yield f"{request_id} {step}\n"
                await asyncio.sleep(STEP_S)
            record.end("finished", steps)
        finally:
            record.end("closed", step)
