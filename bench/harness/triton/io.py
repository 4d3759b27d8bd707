"""Talking to the KServe v2 gRPC side with Triton's own client: the inputs Triton's vLLM backend
takes, reading a result, and an aio ``ModelStreamInfer`` stream that a test drives request by
request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from bench.harness.stack import MODEL


def inputs(prompt: str, *, stream: bool = True, **sampling: Any) -> list[triton.InferInput]:
    """``text_input``, ``stream`` and ``sampling_parameters`` (for the sync and aio clients)."""
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    flag = triton.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    params = triton.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return [text, flag, params]


def text_of(result: Any) -> str | None:
    """The response's ``text_output``; None for a response without one (the empty final)."""
    output = result.as_numpy("text_output")
    return None if output is None else b"".join(output).decode()


def is_final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def cancel_id_of(result: Any) -> str:
    """The id the cancel API knows the request by (``hangup_request_id``)."""
    return str(result.get_response().parameters["hangup_request_id"].string_param)


class Stream:
    """One aio ModelStreamInfer stream: requests are sent when put, results read in order."""

    def __init__(
        self, client: triton_aio.InferenceServerClient, model: str = MODEL, **options: Any
    ) -> None:
        self.model = model
        self._requests: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.responses = client.stream_infer(self._iterate(), **options)

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while (request := await self._requests.get()) is not None:
            yield request

    def send(self, request_id: str, prompt: str, **options: Any) -> None:
        stream = options.pop("stream", True)
        extra: dict[str, Any] = {k: options.pop(k) for k in ("sequence_id", "sequence_start",
                                 "sequence_end") if k in options}  # fmt: skip
        tensors = inputs(prompt, stream=stream, **options)
        request = {"model_name": self.model, "request_id": request_id, "inputs": tensors, **extra}
        self._requests.put_nowait(request)

    def close(self) -> None:
        self._requests.put_nowait(None)

    async def next(self) -> tuple[Any, InferenceServerException | None]:
        async with asyncio.timeout(10):
            result: tuple[Any, InferenceServerException | None] = await anext(self.responses)
            return result

    async def until_final(self, request_id: str) -> list[Any]:
        """Results of ``request_id`` up to its final one (others' results are dropped)."""
        mine: list[Any] = []
        while True:
            result, error = await self.next()
            assert error is None, error
            if result.get_response().id == request_id:
                mine.append(result)
                if is_final(result):
                    return mine


async def hang_up_http(url: str, body: dict[str, Any], events: int | None, after_s: float) -> float:
    """POST ``body`` to ``url``, then close the connection after ``events`` SSE events, or after
    ``after_s`` seconds, whichever comes first; the time (``time.time()``) it was closed."""
    async with aiohttp.ClientSession() as session:
        try:
            async with asyncio.timeout(after_s), session.post(url, json=body) as answer:
                seen = 0
                async for line in answer.content:
                    seen += line.startswith(b"data:")
                    if seen == events:
                        break
        except TimeoutError:
            pass
        return time.time()  # the session's close closes the connection
