"""An async ``predict`` that works in steps of 20 ms and asks ``request.is_disconnected()``
before each; ``chat_completions`` the same, its id the request's ``X-Request-Id`` and its steps
``max_tokens`` (an OpenAI-shaped answer, for LiteLLM's ``openai/`` provider)."""

import asyncio
from typing import Any

import fastapi
from model.record import NothingToLoad, Record, request_of

STEP_S = 0.02


class Model(NothingToLoad):
    async def predict(self, inputs: Any, request: fastapi.Request) -> Any:
        request_id, steps = request_of(inputs, 50)
        done = await self._work(Record("polling", request_id, steps), request)
        return {"id": request_id, "steps": done}

    async def chat_completions(self, inputs: Any, request: fastapi.Request) -> Any:
        request_id = request.headers.get("x-request-id", "")
        steps = int(inputs.get("max_tokens", 50))
        done = await self._work(Record("polling", request_id, steps), request)
        return {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": 0,
            "model": inputs.get("model", "polling"),
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": " x" * done}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": done, "total_tokens": done + 1},
        }  # fmt: skip

    async def _work(self, record: Record, request: fastapi.Request) -> int:
        for step in range(record.steps):
            if await request.is_disconnected():
                record.end("disconnected", step)
                return step
            await asyncio.sleep(STEP_S)
        record.end("finished", record.steps)
        return record.steps
