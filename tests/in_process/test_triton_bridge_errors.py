"""The Triton bridge (``--cancel-adapter triton``) when Triton cannot be reached: a generate call
is answered at once in Triton's error shape with 503, not left hanging or answered 500 (the real
Triton is in ``tests/triton/``)."""

from __future__ import annotations

import socket

import aiohttp

from proxy.config import AdapterName
from tests.support.proxy_harness import http_url, running_proxy


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_generate_when_triton_is_down_is_a_503_in_triton_error_shape() -> None:
    down = closed_port()
    async with (
        running_proxy(f"http://{down}", upstream_grpc=down, cancel_adapter=AdapterName.TRITON) as p,
        aiohttp.ClientSession() as session,
    ):
        for route in ("generate", "generate_stream"):
            url = f"{http_url(p)}/v2/models/m/{route}"
            async with session.post(url, json={"text_input": "hi"}) as answer:
                assert answer.status == 503, await answer.text()
                assert answer.content_type == "application/json"
                assert isinstance((await answer.json())["error"], str)
