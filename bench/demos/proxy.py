"""The whole path: a client streams through the proxy to the gateway and hangs up mid-answer.

Starts the gateway (simulated engine) and the proxy in front of it, both on loopback ports of
their own with a cancel token between them. A client streams a chat completion through the
proxy, closes its connection after a few tokens, and the demo prints what each side recorded:
the proxy's call log line and cancel metrics, the gateway's request log line (phase at cancel,
tokens generated) and cancel metrics, the tokens generated after the hang-up, and the
disconnect → cancel → abort times. Everything stops by itself.

Run: ``.venv/bin/python -m bench.demos.proxy``
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import aiohttp

from bench.base.addresses import host_port
from bench.base.processes import REPO, Process, spawn
from bench.base.scrape import scrape_async
from bench.base.waiting import wait_until

MODEL = "hangup-sim"
TOKENS_BEFORE_HANGUP = 12
REQUEST_ID = "demo-hangup-1"


def say(text: str = "") -> None:
    print(text, flush=True)


async def stream_and_hang_up(proxy_url: str) -> tuple[int, float]:
    """Stream through the proxy, close the connection mid-stream; tokens seen and when it left."""
    body = {
        "model": MODEL, "stream": True, "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
    }  # fmt: skip
    payload = json.dumps(body).encode()
    host, port = host_port(proxy_url)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: demo\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nX-Request-Id: {REQUEST_ID}\r\n\r\n".encode()
        + payload
    )
    say(f"client  → POST {proxy_url}/v1/chat/completions (stream, X-Request-Id: {REQUEST_ID})")
    say(
        "client  ← ",
    )
    tokens = 0
    while tokens < TOKENS_BEFORE_HANGUP:
        line = await reader.readline()
        if line.startswith(b"data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            print(delta, end="", flush=True)
            tokens += 1 if delta else 0
    left_at = time.monotonic()
    writer.transport.abort()  # the hang-up: no goodbye, like a closed browser tab
    say(f"\n\nclient  ✂ hung up after {tokens} tokens")
    return tokens, left_at


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The nonzero samples of ``url/metrics`` (no buckets or creation times), keyed for print."""
    out: dict[str, float] = {}
    for (name, labels), value in (await scrape_async(session, url)).items():
        if value and not name.endswith("_created") and "_bucket" not in name:
            shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels))
            out[f"{name}{{{shown}}}"] = value
    return out


def log_record(process: Process, key: str, value: str) -> dict[str, object]:
    for line in process.log().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get(key) == value and record.get("msg") in ("call", "request_end"):
                return dict(record)
    return {}


async def settle(
    session: aiohttp.ClientSession, gateway: str, proxy_admin: str, token: str
) -> None:
    """Wait (bounded) until the gateway holds nothing and the proxy's cancel call was answered."""
    headers = {"Authorization": f"Bearer {token}"}

    async def settled() -> bool:
        async with session.get(gateway + "/v2/requests", headers=headers) as resp:
            idle = not (await resp.json())["requests"]
        answered = any(
            k.startswith("hangup_proxy_cancel_calls_total")
            for k in await scrape(session, proxy_admin)
        )
        return idle and answered

    with contextlib.suppress(AssertionError):  # bounded: the demo prints what it has
        await wait_until(settled, 10.0, "the gateway idle and the cancel answered")


async def main() -> int:
    work = REPO / ".demo" / "proxy"
    work.mkdir(parents=True, exist_ok=True)
    token = "demo-cancel-token"
    (work / "token").write_text(token)
    common = ["--cancel-token-file", str(work / "token")]
    say("hangup demo: client → proxy → gateway (simulated engine), loopback, ephemeral ports\n")
    gw_args = ["--http-port", "0", "--grpc-port", "0", *common]
    with spawn("gateway_server", gw_args, Path(work)) as gateway:
        px_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                   "--upstream-http", gateway.url(), "--trust-client-request-id",
                   *common]  # fmt: skip
        with spawn("proxy", px_args, Path(work)) as proxy:
            tokens, _ = await stream_and_hang_up(proxy.url())
            async with aiohttp.ClientSession() as session:
                await settle(session, gateway.url(), proxy.url("admin"), token)
                proxy_metrics = await scrape(session, proxy.url("admin"))
                gateway_metrics = await scrape(session, gateway.url())
            report(proxy, gateway, proxy_metrics, gateway_metrics, tokens)
            proxy_code = proxy.terminate()
        gateway_code = gateway.terminate()
    say(f"\nproxy and gateway stopped (exit {proxy_code}, {gateway_code}); logs in {work}")
    return proxy_code or gateway_code


def report(
    proxy: Process, gateway: Process, pm: dict[str, float], gm: dict[str, float], tokens: int
) -> None:
    say("\nthe proxy recorded:")
    call = log_record(proxy, "request_id", REQUEST_ID)
    keep: tuple[str, ...] = (
        "request_id", "status", "outcome", "stage", "reason", "cancel_result", "cancel_ms"
    )  # fmt: skip
    say("  log: " + json.dumps({k: call.get(k) for k in keep}))
    for name, value in pm.items():
        if name.startswith(("hangup_proxy_client_disconnects", "hangup_proxy_cancel_calls_total",
                            "hangup_proxy_requests_total")):  # fmt: skip
            say(f"  {name} {value:g}")
    say("\nthe gateway recorded:")
    end = log_record(gateway, "call_id", REQUEST_ID)
    keep = ("call_id", "outcome", "reason", "phase", "generated_tokens", "duration_s")
    say("  log: " + json.dumps({k: end.get(k) for k in keep}))
    for name, value in gm.items():
        if name.startswith(("hangup_gateway_cancellations", "hangup_gateway_wasted_tokens")):
            say(f"  {name} {value:g}")
    generated = int(str(end.get("generated_tokens", 0)))
    to_cancel = 1000 * total(pm, "hangup_proxy_disconnect_to_cancel_seconds_sum")
    to_abort = 1000 * total(gm, "hangup_gateway_cancel_to_abort_seconds_sum")
    say("\nsummary:")
    say(f"  phase at cancel: {end.get('phase')}; reason: {end.get('reason')}")
    after = generated - tokens
    say(f"  tokens generated after the hang-up: {after} ({generated} generated, {tokens} seen)")
    say(f"  cancel received → engine abort: {to_abort:.2f} ms (gateway: the next step boundary)")
    say(f"  disconnect → cancel answered: {to_cancel:.2f} ms (proxy; answered after the abort)")


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k.split("{")[0] == name)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
