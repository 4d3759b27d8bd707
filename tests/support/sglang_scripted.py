"""A scripted stand-in for SGLang's HTTP server, written from SGLang 0.5.23's documented behaviour;
it is *not* SGLang (SGLang cannot run on this machine). It plays what the ``sglang`` cancel
adapter depends on, and records what it saw:

- ``POST /v1/chat/completions``, ``/v1/completions``, ``/generate``: the request id is the body's
  ``rid`` (a fresh one when absent); ``X-Request-Id`` is ignored; ``n > 1`` runs one request per
  choice, rids ``{rid}_{i}``. One token every ``step`` seconds up to ``max_tokens``
  (``sampling_params.max_new_tokens`` for ``/generate``); streaming answers are SSE events, one
  per token, then ``data: [DONE]``.
- A streaming request notices its client left when a write fails; a non-streaming one only every
  ``disconnect_poll`` seconds (SGLang's default is 4 s), so a hang-up costs generation until then
  unless someone aborts it.
- ``POST /abort_request`` ``{"rid", "abort_all"}``: aborts every live request whose rid *starts
  with* ``rid`` (all of them with ``abort_all``); answers 200 with an empty body whether or not
  anything matched; wants ``Authorization: Bearer <admin_key>`` when ``admin_key`` is set (401).
  ``abort_script`` can answer the next calls with other statuses.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Run:
    """One engine request as the scripted server ran it."""

    rid: str
    stream: bool
    tokens: int = 0
    ended: str | None = None  # "finished", "aborted" or "disconnected"
    ended_at: float | None = None

    def end(self, how: str) -> None:
        if self.ended is None:
            self.ended, self.ended_at = how, time.monotonic()


@dataclass
class AbortCall:
    rid: str | None
    abort_all: bool | None
    authorization: str | None


@dataclass
class ScriptedSGLang:
    step: float = 0.01
    disconnect_poll: float = 4.0
    admin_key: str | None = None
    abort_script: deque[int] = field(default_factory=deque)
    runs: dict[str, Run] = field(default_factory=dict)
    aborts: list[AbortCall] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.address = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> None:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/generate"):
            app.router.add_post(path, self._generate)
        app.router.add_post("/abort_request", self._abort)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.address = f"127.0.0.1:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, predicate: Any, within: float = 10.0) -> None:
        """Until ``predicate()`` holds (checked at every change); fails after ``within`` s."""

        async def holds() -> None:
            async with self.changed:
                await self.changed.wait_for(predicate)

        try:
            await asyncio.wait_for(holds(), within)
        except TimeoutError:
            raise AssertionError(
                f"timed out after {within}s: runs {self.runs}, aborts {self.aborts}"
            ) from None

    def live(self) -> list[str]:
        return [rid for rid, run in self.runs.items() if run.ended is None]

    async def _note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        self.headers.append(dict(request.headers))
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        n = int(body.get("n", 1))
        runs = [Run(rid if n == 1 else f"{rid}_{i}", bool(body.get("stream"))) for i in range(n)]
        for run in runs:
            self.runs[run.rid] = run
        await self._note()
        max_tokens = int(
            body.get("max_tokens") or body.get("sampling_params", {}).get("max_new_tokens", 16)
        )
        if runs[0].stream:
            return await self._stream(request, runs, max_tokens)
        return await self._whole(request, runs, max_tokens)

    async def _step(self, runs: list[Run], max_tokens: int) -> bool:
        """One engine step for ``runs``; False once none is left running."""
        await asyncio.sleep(self.step)
        for run in runs:
            if run.ended is None:
                run.tokens += 1
                if run.tokens >= max_tokens:
                    run.end("finished")
        await self._note()
        return any(run.ended is None for run in runs)

    async def _stream(
        self, request: web.Request, runs: list[Run], max_tokens: int
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while await self._step(runs, max_tokens):
                event = {"choices": [{"index": i, "text": "x"} for i in range(len(runs))]}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionError, RuntimeError):
            pass  # the write failed: the client left
        for run in runs:
            run.end("disconnected")
        await self._note()
        return response

    async def _whole(self, request: web.Request, runs: list[Run], max_tokens: int) -> web.Response:
        next_poll = time.monotonic() + self.disconnect_poll
        while await self._step(runs, max_tokens):
            if time.monotonic() >= next_poll:
                next_poll += self.disconnect_poll
                if request.transport is None or request.transport.is_closing():
                    for run in runs:
                        run.end("disconnected")
                    await self._note()
        text = [{"index": i, "text": "x" * run.tokens} for i, run in enumerate(runs)]
        return web.json_response({"choices": text})

    async def _abort(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        body = await request.json()
        self.aborts.append(AbortCall(body.get("rid"), body.get("abort_all"), auth))
        await self._note()
        if self.admin_key is not None and auth != f"Bearer {self.admin_key}":
            return web.Response(status=401, text="unauthorized")
        if self.abort_script:
            return web.Response(status=self.abort_script.popleft())
        prefix = str(body.get("rid") or "")
        for run in self.runs.values():
            if run.ended is None and (body.get("abort_all") or run.rid.startswith(prefix)):
                run.end("aborted")
        await self._note()
        return web.Response(status=200)
