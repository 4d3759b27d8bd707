"""The sidecar's cancel API under hostile callers (issue 59's robustness items), against live
processes: ``python -m proxy`` with a cancel token, the simulated gateway behind or recording
servers that say what reached them.

- An ``Authorization`` value that is not UTF-8 is a 401, on the proxy and on the gateway (the
  check is ``hangup_contract.cancel.bearer_matches``, shared), never a 500.
- A cancel body that stalls is a 408, a broken chunked one a 400 (they were 500s).
- A cancel for an id the proxy does not hold, asked of the gateway (adapter ``hangup``), keeps
  its ``reason`` (it lost its body: ``shutdown`` arrived as ``explicit``), and is the proxy's own
  call: to ``--cancel-url`` with the proxy's token, nothing of the caller's (its
  ``Authorization`` and ``Cookie`` went to ``--upstream-http`` even where ``--cancel-url``
  pointed elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bench.base.processes import spawn
from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.stack import MODEL, TOKEN, RawClients, completion_request, running_stack

NOT_UTF8 = b"Authorization: Bearer \xff\xfe\xc3(\r\n"


async def answer_of(raw: RawClients, url: str, request: bytes) -> tuple[int, bytes]:
    """The status and body the server answers ``request`` with (the connection kept open)."""
    reader, _ = await raw.open(url, request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    status = int(head.split(b" ", 2)[1])
    fields = dict(
        line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
    )  # fmt: skip
    length = {k.lower(): v for k, v in fields.items()}.get(b"content-length", b"0")
    return status, await asyncio.wait_for(reader.readexactly(int(length)), 15)


def _failed(log: str) -> list[str]:
    return [line for line in log.splitlines() if '"level": "ERROR"' in line or "Traceback" in line]


@pytest.mark.parametrize("side", ["proxy", "gateway"])
async def test_an_authorization_that_is_not_utf8_is_refused_401(
    tmp_path: Path, raw: RawClients, side: str
) -> None:
    with running_stack(tmp_path, []) as stack:
        url = stack.proxy_url if side == "proxy" else stack.gateway_url
        cancel = b"POST /v2/requests/x/cancel HTTP/1.1\r\nHost: p\r\n" + NOT_UTF8
        status, body = await answer_of(raw, url, cancel + b"Content-Length: 0\r\n\r\n")
        assert status == 401, body
        if side == "gateway":  # its listing of calls is behind the same check
            listing = b"GET /v2/requests HTTP/1.1\r\nHost: p\r\n" + NOT_UTF8 + b"\r\n"
            assert (await answer_of(raw, url, listing))[0] == 401
        assert _failed(stack.proxy.log()) == [] and _failed(stack.gateway.log()) == []


async def test_a_stalled_cancel_body_is_408_and_a_broken_chunked_one_400(
    tmp_path: Path, raw: RawClients
) -> None:
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    head = b"POST /v2/requests/x/cancel HTTP/1.1\r\nHost: p\r\n" + auth
    with running_stack(tmp_path, [], ["--body-timeout", "1"]) as stack:
        stalled = head + b'Content-Length: 40\r\n\r\n{"rea'  # and then nothing
        status, body = await answer_of(raw, stack.proxy_url, stalled)
        assert status == 408 and b"no bytes of the request body" in body
        broken = head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n"
        status, body = await answer_of(raw, stack.proxy_url, broken)
        assert status == 400 and json.loads(body)["error"]["code"] == 400
        assert _failed(stack.proxy.log()) == []


async def test_a_cancel_asked_of_the_gateway_keeps_its_reason(
    tmp_path: Path, raw: RawClients
) -> None:
    """A call the proxy does not hold (sent to the gateway another way), cancelled through the
    proxy with ``{"reason": "shutdown"}``: the gateway counts it as ``shutdown``."""
    slow = ["--sim-step-base", "0.02"]
    with running_stack(tmp_path, slow) as stack:
        body = {"model": MODEL, "prompt": "long", "max_tokens": 3000, "stream": True}
        reader, _ = await raw.open(
            stack.gateway_url, completion_request("/v1/completions", body, request_id="direct-1")
        )
        async with asyncio.timeout(10):
            while not (await reader.readline()).startswith(b"data: {"):
                pass
        async with aiohttp.ClientSession() as session:
            async with session.post(
                stack.proxy_url + "/v2/requests/direct-1/cancel",
                json={"reason": "shutdown"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp:
                answer = await resp.json()
            assert resp.status == 200 and answer["state"] == "cancelled", answer
            assert answer["phase"] == "decode"  # the gateway's own answer, passed on

            async def counted() -> bool:
                samples = await scrape_async(session, stack.gateway_url)
                return total(samples, "hangup_gateway_cancellations_total", reason="shutdown") == 1

            await wait_until(counted, within=10, what="the cancel counted as shutdown")
            samples = await scrape_async(session, stack.gateway_url)
        assert total(samples, "hangup_gateway_cancellations_total", reason="explicit") == 0


class Recorder:
    """A server that records every request it gets (path, headers) and answers 404 JSON."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers)))
        body = {"error": "no such call", "reason": json.loads(await request.read() or b"{}")}
        return web.json_response(body, status=404)


@contextlib.asynccontextmanager
async def recording() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield recorder, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_callers_credentials_never_leave_with_the_cancel_the_proxy_makes(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("the-proxys-token")
    async with recording() as (upstream, upstream_url), recording() as (canceller, cancel_url):
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", upstream_url, "--cancel-url", cancel_url,
                "--cancel-token-file", str(tmp_path / "token")]  # fmt: skip
        with spawn("proxy", args, tmp_path / "proxy") as proxy:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    proxy.url() + "/v2/requests/elsewhere-1/cancel",
                    json={"reason": "deadline_exceeded"},
                    headers={
                        "Authorization": "Bearer the-proxys-token",
                        "Cookie": "session=the-callers-secret",
                        "X-Api-Key": "the-callers-key",
                    },
                ) as resp,
            ):
                status, answer = resp.status, await resp.json()
    assert upstream.seen == []  # nothing went to --upstream-http
    assert len(canceller.seen) == 1
    path, headers = canceller.seen[0]
    assert path == "/v2/requests/elsewhere-1/cancel"
    assert headers["Authorization"] == "Bearer the-proxys-token"
    assert "Cookie" not in headers and "X-Api-Key" not in headers
    assert (status, answer["reason"]) == (404, {"reason": "deadline_exceeded"})
