"""A scripted upstream for the proxy's adapter-level tests: a real aiohttp server on 127.0.0.1:0.

It is *not* a model server: each route plays one upstream behaviour on cue, and everything it
sees is recorded so tests can assert on it without sleeping.

- ``/echo``                 answers the request's method, path, headers and body as JSON
- ``/sse?events=N``         streams N SSE events; with ``gate=1`` each waits for ``release()``;
                            with ``usage=1`` each carries ``usage`` as ``vllm serve``'s
                            ``continuous_usage_stats`` chunks do (7 prompt tokens, one a chunk)
- ``/answer``               an SSE answer whose first event opens with its own ``id``
                            (``chatcmpl-`` and the call's ``X-Request-Id``), then nothing more
                            until its client goes (``closed``), as a long generation does
- ``/hold``                 reads the body, never answers; ``held`` / ``closed`` events
  (also ``/v1/responses`` and below: a Responses call that runs until its client leaves)
- ``/status/{code}``        answers ``code`` with a JSON error body
- ``/break``                sends headers and one chunk, then drops the connection
- ``POST /v2/requests/{id}/cancel``  records the call and answers per ``cancel_script``
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class CancelCall:
    request_id: str
    reason: str | None
    authorization: str | None


@dataclass
class ScriptedUpstream:
    cancel_script: deque[tuple[int, dict[str, object]] | str] = field(default_factory=deque)
    cancel_default: tuple[int, dict[str, object]] | str = (200, {"state": "cancelled"})
    cancels: list[CancelCall] = field(default_factory=list)
    requests: list[dict[str, object]] = field(default_factory=list)
    held_bodies: list[bytes] = field(default_factory=list)
    cancels_inflight: int = 0
    cancels_inflight_max: int = 0

    def __post_init__(self) -> None:
        self.cancel_seen = asyncio.Condition()
        self.held = asyncio.Event()
        self.closed = asyncio.Event()  # a held request's connection went away
        self.body_started = asyncio.Event()
        self._gate = asyncio.Condition()
        self._released = 0
        self._runner: web.AppRunner | None = None
        self.address = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_route("*", "/echo/{tail:.*}", self._echo)
        app.router.add_get("/sse", self._sse)
        app.router.add_route("*", "/hold", self._hold)
        app.router.add_route("*", "/answer", self._answer)
        app.router.add_route("*", "/v1/responses", self._hold)
        app.router.add_route("*", "/v1/responses/{tail:.*}", self._hold)
        app.router.add_get("/status/{code}", self._status)
        app.router.add_get("/break", self._break)
        app.router.add_post("/v2/requests/{id}/cancel", self._cancel)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.address = f"127.0.0.1:{sock.getsockname()[1]}"
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def release(self, n: int = 1) -> None:
        async with self._gate:
            self._released += n
            self._gate.notify_all()

    async def wait_cancels(self, n: int) -> list[CancelCall]:
        async with self.cancel_seen:
            await self.cancel_seen.wait_for(lambda: len(self.cancels) >= n)
        return list(self.cancels)

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        seen = {
            "method": request.method,
            "path": request.path_qs,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body": body.decode("latin-1"),
        }
        self.requests.append(seen)
        return web.json_response(seen)

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        events = int(request.query.get("events", "3"))
        gated = request.query.get("gate") == "1"
        usage = request.query.get("usage") == "1"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(events):
            if gated:
                async with self._gate:
                    await self._gate.wait_for(lambda i=i: self._released > i)
            event: dict[str, object] = {"n": i}
            if usage:
                event["usage"] = {"prompt_tokens": 7, "completion_tokens": i + 1,
                                  "total_tokens": 8 + i}  # fmt: skip
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = {"id": "chatcmpl-" + request.headers.get("X-Request-Id", ""),
                 "object": "chat.completion.chunk", "created": 1, "model": "scripted"}  # fmt: skip
        try:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            self.held.set()
            await asyncio.Event().wait()
        finally:
            self.closed.set()
        raise AssertionError("unreachable")

    async def _hold(self, request: web.Request) -> web.StreamResponse:
        try:
            body = bytearray()
            async for chunk in request.content.iter_any():
                self.body_started.set()
                body += chunk
            self.held_bodies.append(bytes(body))
            self.held.set()
            await asyncio.Event().wait()
        finally:
            self.closed.set()
        raise AssertionError("unreachable")

    async def _status(self, request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        body = {"error": {"message": f"scripted {code}", "type": "invalid_request_error"}}
        return web.json_response(body, status=code)

    async def _break(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"partial")
        assert request.transport is not None
        request.transport.abort()
        return response

    async def _cancel(self, request: web.Request) -> web.Response:
        self.cancels_inflight += 1
        self.cancels_inflight_max = max(self.cancels_inflight_max, self.cancels_inflight)
        try:
            body = json.loads(await request.read() or b"{}")
            async with self.cancel_seen:
                self.cancels.append(
                    CancelCall(
                        request.match_info["id"],
                        body.get("reason"),
                        request.headers.get("Authorization"),
                    )
                )
                self.cancel_seen.notify_all()
            step = self.cancel_script.popleft() if self.cancel_script else self.cancel_default
            if step == "hang":
                await asyncio.Event().wait()
            assert not isinstance(step, str)
            status, payload = step
            return web.json_response(
                {"request_id": request.match_info["id"], **payload}, status=status
            )
        finally:
            self.cancels_inflight -= 1
