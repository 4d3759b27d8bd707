"""``make demo``, part two: an operator cancels a streamed completion by id through the
gateway's cancel API, and what the gateway recorded.

Starts the gateway (simulated engine) on loopback ports of its own, streams a completion,
cancels it through the cancel API after a few tokens, then prints the cancel answer, the end of
the stream, the gateway's metrics about it, and its log line. Everything stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from bench.base.processes import REPO, Process, spawn

MODEL = "hangup-sim"
TOKENS_BEFORE_CANCEL = 12
WATCHED = (
    "hangup_gateway_requests_total",
    "hangup_gateway_cancellations_total",
    "hangup_gateway_generated_tokens_total",
    "hangup_gateway_wasted_tokens_total",
    "hangup_gateway_cancel_to_abort_seconds_count",
    "hangup_gateway_cancel_to_abort_seconds_sum",
)


def say(text: str = "") -> None:
    print(text, flush=True)


async def stream_then_cancel(gateway: str) -> None:
    body = {
        "model": MODEL, "stream": True, "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
    }  # fmt: skip
    headers = {"X-Request-Id": "demo-1"}
    async with aiohttp.ClientSession() as session:
        say(f"client  → POST {gateway}/v1/chat/completions (stream, X-Request-Id: demo-1)")
        async with session.post(
            f"{gateway}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            tokens = 0
            say(
                "client  ← ",
            )
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    say(f"\nclient  ← stream ended with: {event['error']['message']} (no [DONE])")
                    break
                delta = event["choices"][0]["delta"].get("content", "")
                print(delta, end="", flush=True)
                tokens += 1 if delta else 0
                if tokens == TOKENS_BEFORE_CANCEL:
                    say(f"\n\noperator → POST /v2/requests/demo-1/cancel after {tokens} tokens")
                    async with session.post(f"{gateway}/v2/requests/demo-1/cancel") as cancel:
                        say(f"gateway  ← {cancel.status} {await cancel.text()}")
        async with session.get(f"{gateway}/metrics") as metrics:
            text = await metrics.text()
    say("\nwhat the gateway recorded (non-zero series):")
    for sample in text.splitlines():
        if sample.startswith(WATCHED) and not sample.endswith(" 0.0"):
            say(f"  {sample}")


def print_log(gateway: Process) -> None:
    for line in gateway.log().splitlines():
        if '"request_end"' in line:
            record = json.loads(line)
            keep = ("request_id", "outcome", "reason", "phase", "generated_tokens", "duration_s")
            say("  log: " + json.dumps({k: record[k] for k in keep}))


async def main() -> int:
    work = REPO / ".demo"
    say("\nhangup demo, part two: an operator cancels by id through the gateway's cancel API\n")
    with spawn("gateway_server", ["--http-port", "0", "--grpc-port", "0"], Path(work)) as gateway:
        await stream_then_cancel(gateway.url())
        print_log(gateway)
        code = gateway.terminate()
    say(f"\ngateway stopped (exit {code}); logs in {work}")
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
