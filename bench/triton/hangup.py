"""Benchmark: what reaches a real Triton's model when a client hangs up, direct, through hangup's
proxy relaying HTTP as it is, and through its Triton bridge.

One real Triton 2.51.0 (``bench/harness/triton/server.py``: the tier's launcher, the project's
python-backend models, each checking ``is_cancelled()`` every 50 ms step and recording how each
request ended) and two proxies in front of it: ``--cancel-adapter none`` (``proxy``: HTTP relayed
as it is; over gRPC, closing the upstream call is Triton's cancellation) and ``--cancel-adapter
triton`` (``bridge``: HTTP generate carried over gRPC, ``proxy.triton``; its gRPC side is the
same relay, so the gRPC rows are not repeated for it). One call at a time, per path and target:

- ``grpc_stream``: ``ModelStreamInfer`` on the streamer, cancelled after its third token;
- ``grpc_deadline``: ``ModelInfer`` on the slow model with a 0.5 s deadline;
- ``http_generate``: ``POST .../generate`` on the streamer, the connection closed after 0.3 s;
- ``http_stream``: ``POST .../generate_stream``, closed after the third event;
- ``http_stream_silent``: the same, closed during a 1.5 s silent phase before the first token
  (as a long prefill).

Per row: the calls whose hang-up the model saw (``is_cancelled()``), the time from the hang-up
to the model seeing it (p50/p99, ms), and the model steps run after the hang-up (p50/max; a
hang-up never seen costs the whole request: ``LONG`` steps). The HTTP rows through ``proxy`` are
what closing the upstream connection does (Triton does not notice); ``bridge`` is the fix.

Then the price of the bridge: ``--cost-calls`` short ``generate`` calls (one token, one 1 ms step)
one at a time through ``proxy`` (HTTP relayed) and through ``bridge`` (carried over gRPC), in
alternating rounds; per target, the proxy process's CPU per call and the call's time p50/p99.

Run: ``.venv/bin/python -m bench.triton.hangup`` (``--calls 5`` for a quick look; needs
``.venv-triton``, which ``make test`` installs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from bench.base.processes import REPO, spawn
from bench.base.waiting import wait_until
from bench.harness.triton.io import Stream, hang_up_http
from bench.harness.triton.server import TritonServer, install, running_triton
from bench.instruments.stats import cpu_seconds, median_p99

STEP_S = 0.05
LONG = 60  # tokens or steps: 3 s, what a hang-up never seen costs each call here
SILENT_S = 1.5
# (target, key) -> (when it hung up, the model's steps by then)
Hangup = Callable[[str, str], Awaitable[tuple[float, int]]]


async def grpc_stream(address: str, key: str) -> tuple[float, int]:
    client = triton_aio.InferenceServerClient(address)
    try:
        stream = Stream(client, model="streamer")
        stream.send(key, key, max_tokens=LONG)
        for _ in range(3):
            _, error = await stream.next()
            assert error is None, error
        when = time.time()
        stream.responses.cancel()
        return when, 3
    finally:
        await client.close()


async def grpc_deadline(address: str, key: str) -> tuple[float, int]:
    tensor = triton.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.float32))
    client = triton_aio.InferenceServerClient(address)
    started = time.time()
    try:
        await client.infer("slow", [tensor], request_id=key, parameters={"steps": LONG},
                           client_timeout=0.5)  # fmt: skip
    except InferenceServerException:
        pass
    finally:
        await client.close()
    return started + 0.5, int(0.5 / STEP_S)


def http(route: str, *, stream: bool, silent_s: float = 0.0) -> Hangup:
    async def hang_up(base: str, key: str) -> tuple[float, int]:
        params = {"max_tokens": LONG, "prefill_s": silent_s}
        body = {"text_input": key, "stream": stream, "sampling_parameters": json.dumps(params)}
        url = f"{base}/v2/models/streamer/{route}"
        if not stream:
            return await hang_up_http(url, body, None, 0.3), int(0.3 / STEP_S)
        if silent_s:
            return await hang_up_http(url, body, None, 0.3), int(0.3 / STEP_S)
        return await hang_up_http(url, body, 3, 30.0), 3

    return hang_up


PATHS: dict[str, tuple[str, str, Hangup]] = {  # name: (model, protocol, hang-up)
    "grpc_stream": ("streamer", "grpc", grpc_stream),
    "grpc_deadline": ("slow", "grpc", grpc_deadline),
    "http_generate": ("streamer", "http", http("generate", stream=False)),
    "http_stream": ("streamer", "http", http("generate_stream", stream=True)),
    "http_stream_silent": ("streamer", "http", http("generate_stream", stream=True,
                                                     silent_s=SILENT_S)),
}  # fmt: skip


async def run_row(server: TritonServer, target: str, name: str, calls: int) -> str:
    model, _, hang_up = PATHS[name]
    by = "id" if model == "slow" or name.startswith("grpc") else "prompt"
    seen_ms: list[float] = []
    steps_after: list[float] = []
    for i in range(calls):
        key = f"{name}-{target}-{i}-{time.monotonic_ns()}"
        when, steps_then = await hang_up(target, key)

        def ended(key: str = key) -> dict[str, Any]:
            line = server.ended(model, by).get(key, {})
            return {} if line.get("how") == "started" else line  # empty, so falsy, until it ended

        end = await wait_until(ended, LONG * STEP_S + 10, f"{model} to end {key}")
        steps_after.append(max(0, end["steps"] - steps_then))
        if end["how"] == "cancelled":
            seen_ms.append(1000 * (end["at"] - when))
    seen = median_p99(seen_ms, 0) if seen_ms else "never"
    after = f"{statistics.median(steps_after):.0f}/{max(steps_after):.0f}"
    return f"{len(seen_ms):>4}/{calls:<4} {seen:>17} {after:>13}"


async def cost(targets: dict[str, tuple[str, int]], calls: int, rounds: int = 4) -> None:
    """CPU per short ``generate`` call of each proxy process, and the calls' times."""
    params = json.dumps({"max_tokens": 1, "step_s": 0.001})
    body = {"text_input": "cost", "sampling_parameters": params}
    cpu: dict[str, float] = dict.fromkeys(targets, 0.0)
    times: dict[str, list[float]] = {name: [] for name in targets}
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            for name, (base, pid) in targets.items():
                url = f"{base}/v2/models/streamer/generate"
                before = cpu_seconds(pid)
                for _ in range(calls // rounds):
                    started = time.perf_counter()
                    async with session.post(url, json=body) as answer:
                        assert answer.status == 200, await answer.text()
                        await answer.read()
                    times[name].append(1000 * (time.perf_counter() - started))
                cpu[name] += cpu_seconds(pid) - before
    print(f"\n{'target':>7} {'calls':>6} {'proxy CPU us/call':>18} {'call ms p50/p99':>16}")
    for name in targets:
        done = len(times[name])
        print(f"{name:>7} {done:>6} {1e6 * cpu[name] / done:>18.0f}"
              f" {median_p99(times[name], 2):>16}", flush=True)  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--cost-calls", type=int, default=2000)
    args = parser.parse_args()
    found = install()
    if isinstance(found, str):
        raise SystemExit(found)
    work = REPO / ".demo" / f"bench-triton-{time.time_ns()}"
    with running_triton(Path(work), found) as server:
        proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                      "--upstream-http", server.url(), "--upstream-grpc", server.grpc,
                      "--cancel-adapter", "none"]  # fmt: skip
        bridge_args = [*proxy_args[:-1], "triton"]
        with (
            spawn("proxy", proxy_args, work / "proxy") as proxy,
            spawn("proxy", bridge_args, work / "bridge") as bridge,
        ):
            targets = {
                "direct": {"grpc": server.grpc, "http": server.url()},
                "proxy": {"grpc": proxy.listeners["grpc"], "http": proxy.url()},
                "bridge": {"http": bridge.url()},
            }
            print(f"{'path':>19} {'target':>7} {'seen/calls':>10} {'seen ms p50/p99':>17}"
                  f" {'steps after p50/max':>13}")  # fmt: skip
            for name in args.paths.split(","):
                protocol = PATHS[name][1]
                for target, addresses in targets.items():
                    if protocol in addresses:
                        row = await run_row(server, addresses[protocol], name, args.calls)
                        print(f"{name:>19} {target:>7} {row}", flush=True)
            if args.cost_calls:
                relays = {p: (process.url(), process.popen.pid)
                          for p, process in (("proxy", proxy), ("bridge", bridge))}  # fmt: skip
                await cost(relays, args.cost_calls)
            proxy.terminate()
            bridge.terminate()


if __name__ == "__main__":
    asyncio.run(main())
