"""The proxy's HTTP server on uvloop, the loop it runs on for users (``proxy.cli``). The other
in-process tests run it on asyncio's own loop, whose transports differ (uvloop's are no subclass
of ``asyncio.Transport``, and their write, close and half-close paths are their own). One
scenario in a uvloop of its own: pipelined calls answered in order, a hang-up mid-stream
cancelled upstream, and a refused body's 413 read whole while the client keeps sending."""

from __future__ import annotations

import asyncio
import json

import uvloop

from tests.support.proxy_harness import answer_while_sending, raw_request, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream


def test_the_server_pipelines_cancels_and_lingers_on_uvloop() -> None:
    loop = uvloop.new_event_loop()
    loop.run_until_complete(_scenario())
    loop.close()  # only once it passed: closing after a failure can wait on its leftovers


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer framed by its length: its head and its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


async def _scenario() -> None:
    upstream = ScriptedUpstream()
    await upstream.start()
    try:
        async with asyncio.timeout(10), running_proxy(upstream.url, max_body_size=1000) as proxy:
            address = proxy.addresses["http"]
            reader, writer = await raw_request(
                address,
                b"GET /echo/0 HTTP/1.1\r\nHost: m\r\n\r\nGET /echo/1 HTTP/1.1\r\nHost: m\r\n\r\n",
            )
            answers = [await _answer(reader) for _ in range(2)]
            writer.close()
            assert [json.loads(body)["path"] for _, body in answers] == ["/echo/0", "/echo/1"]

            reader, writer = await raw_request(
                address, b"GET /sse?events=5&gate=1 HTTP/1.1\r\nHost: m\r\n\r\n"
            )
            await upstream.release(1)
            head = await reader.readuntil(b"\r\n\r\n")
            assert b'data: {"n": 0}' in await reader.readuntil(b"\n\n")
            writer.close()  # the hang-up
            (cancel,) = await upstream.wait_cancels(1)
            call_id = head.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
            assert (cancel.request_id, cancel.reason) == (call_id, "client_disconnect")

            reader, writer = await raw_request(
                address, b"POST /echo HTTP/1.1\r\nHost: m\r\nContent-Length: 104857600\r\n\r\n"
            )
            answer = await answer_while_sending(reader, writer)
            assert answer.startswith(b"HTTP/1.1 413") and b"exceeds 1000" in answer
    finally:
        await upstream.stop()
