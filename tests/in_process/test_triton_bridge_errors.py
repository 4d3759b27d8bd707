"""The Triton bridge (``--cancel-adapter triton``) answering errors in Triton's shape, live: when
Triton cannot be reached, a generate call is a 503 at once, not left hanging or answered 500;
malformed input is a 400 before anything goes up (a stand-in for Triton's gRPC service,
``tests/support/triton_stand_in.py``; the real Triton is in ``tests/triton/``)."""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.config import AdapterName
from proxy.triton.infer import HEADER_LENGTH
from tests.pure.test_triton_refusals import BINARY, INFER_REFUSED
from tests.support.proxy_harness import http_url, running_proxy
from tests.support.triton_stand_in import running_stand_in


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


async def _posted(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    async with session.post(url, data=body, headers=headers or {}) as answer:
        return answer.status, answer.content_type, await answer.json(content_type=None)


async def test_malformed_bridge_input_is_a_400_in_triton_shape_never_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 59: each malformed body (shapes of strings, nulls, 1e999; binary_data_size "abc";
    lone surrogates; parameters beyond int64 or a double; values out of range; a 5,000-digit
    integer; deep nesting; binary data longer than declared) through a live bridge is a 400 in
    Triton's ``{"error": ...}`` shape, and nothing is logged at error level."""
    caplog.set_level(logging.WARNING)
    async with (
        running_stand_in() as triton,
        running_proxy(
            "http://127.0.0.1:9", upstream_grpc=triton.address, cancel_adapter=AdapterName.TRITON
        ) as p,
        aiohttp.ClientSession() as session,
    ):
        infer = f"{http_url(p)}/v2/models/echo/infer"
        for what, body, _ in INFER_REFUSED:
            status, kind, answer = await _posted(session, infer, body)
            assert (status, kind, list(answer)) == (400, "application/json", ["error"]), what
        head = json.dumps({"inputs": [BINARY]}).encode()
        length = {HEADER_LENGTH: str(len(head))}
        status, _, answer = await _posted(session, infer, head + b"\0" * 12, length)
        assert (status, answer) == (400, {"error": "unexpected additional input data for "
                                                   "model 'echo'"})  # fmt: skip
        generate = f"{http_url(p)}/v2/models/echo/generate"
        for body in (b'{"COUNT": 9223372036854775808}', b'{"INPUT0": 1' + b"0" * 400 + b"}",
                     b'{"TEXT": "\\ud800"}', b'{"COUNT": ' + b"9" * 5000 + b"}",
                     b'{"INPUT0": ' + b"[" * 3000 + b"]" * 3000 + b"}"):  # fmt: skip
            status, _, answer = await _posted(session, generate, body)
            assert (status, list(answer)) == (400, ["error"]), body[:40]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("model", ["%ff", "%65cho", "ech%6F"])
async def test_a_model_named_with_percent_escapes_is_that_name_as_triton_reads_it(
    model: str,
) -> None:
    """Triton's HTTP frontend decodes no percent escapes in a model's name: ``%65cho`` is not
    ``echo`` (404 in Triton's words), and ``%ff``, which decodes to no UTF-8, is a name too (it
    was a 500 when the bridge decoded it)."""
    async with (
        running_stand_in() as triton,
        running_proxy(
            "http://127.0.0.1:9", upstream_grpc=triton.address, cancel_adapter=AdapterName.TRITON
        ) as p,
        aiohttp.ClientSession() as session,
    ):
        url = f"{http_url(p)}/v2/models/{model}/infer"
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                       "data": [1]}]}).encode()  # fmt: skip
        async with session.post(URL(url, encoded=True), data=body) as answer:  # sent as written
            assert answer.status == 404
            assert await answer.json(content_type=None) == {
                "error": f"Request for unknown model: '{model}' is not found"
            }
        assert triton.received == []
