"""Several hangup pods (a gateway with the simulated engine and a proxy in front, as in the
chart's pod) behind a real Envoy balancing over the proxies with least-request, and a burst of
mixed calls through it, some clients hanging up at random points; what every side recorded.

Shared by ``tests/multi_process/test_scale_out.py``, ``bench/scale_out/pods.py`` and the demo's
third part. Every call is one of: an OpenAI completion (streamed or not), an OpenAI chat completion
(streamed or not), a Triton ``generate_stream``. A call that hangs up asks for many tokens, so
it is still running when its client leaves; it leaves before the answer's head, after a random
number of events, or (not streamed) after a random time. A call that completes asks for a few
and must come back whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import port_of
from bench.base.scrape import Samples, parse, total
from bench.harness.envoy import Envoy, running_envoy
from bench.harness.stack import MODEL, TOKEN, Stack, running_stack

KINDS = ("completion", "completion_stream", "chat", "chat_stream", "generate_stream")
LONG = 3000  # tokens: a hung-up call is still running when its client leaves
SHORT = 12
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Pods:
    envoy: Envoy
    pods: list[Stack]


@contextlib.contextmanager
def running_pods(tmp: Path, count: int, gateway_args: list[str]) -> Iterator[Pods]:
    proxy_args = ["--trust-client-request-id"]  # the client's ids reach the gateways' logs
    with contextlib.ExitStack() as stack:
        pods = [stack.enter_context(running_stack(tmp / f"pod-{i}", gateway_args, proxy_args))
                for i in range(count)]  # fmt: skip
        ports = [port_of(pod.proxy_url) for pod in pods]
        envoy = stack.enter_context(running_envoy(ports, tmp / "envoy", lb_policy="LEAST_REQUEST"))
        yield Pods(envoy, pods)


@dataclass
class Call:
    n: int
    kind: str
    hang_up: bool
    status: int | None = None
    events: list[str] = field(default_factory=list)
    body: dict[str, Any] | None = None
    problem: str | None = None  # a completed call that did not come back whole

    @property
    def request_id(self) -> str:
        return f"call-{self.n}"  # the proxies trust it: the gateways' logs carry it


def plan(count: int, seed: int) -> list[Call]:
    rng = random.Random(seed)
    hang_ups = set(rng.sample(range(count), count // 2))
    return [Call(n, rng.choice(KINDS), n in hang_ups) for n in range(count)]


def _request(call: Call) -> tuple[str, dict[str, Any]]:
    tokens = LONG if call.hang_up else SHORT
    stream = call.kind.endswith("_stream")
    if call.kind == "generate_stream":
        return f"/v2/models/{MODEL}/generate_stream", {
            "text_input": "once upon a time", "parameters": {"max_tokens": tokens}}  # fmt: skip
    if call.kind.startswith("chat"):
        return "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": tokens, "stream": stream}  # fmt: skip
    return "/v1/completions", {"model": MODEL, "prompt": "once upon a time",
                               "max_tokens": tokens, "stream": stream}  # fmt: skip


async def run_call(
    session: aiohttp.ClientSession, url: str, call: Call, rng: random.Random
) -> Call:
    path, body = _request(call)
    streamed = call.kind.endswith("_stream")
    leave_after = rng.choice([0, 1, 2, 5, 10, 20]) if call.hang_up else None
    try:
        if call.hang_up and (not streamed or rng.random() < 0.2):
            # Leave before the head (a streamed call) or before the answer (not streamed).
            async with asyncio.timeout(rng.uniform(0.01, 0.3)):
                await _exchange(session, url + path, body, call, None)
            call.problem = "a hung-up call finished before its client left"
        else:
            await _exchange(session, url + path, body, call, leave_after)
    except TimeoutError:
        pass  # the client left: its connection was closed
    if not call.hang_up:
        call.problem = _whole(call)
    return call


async def _exchange(session: aiohttp.ClientSession, url: str, body: dict[str, Any], call: Call,
                    leave_after: int | None) -> None:  # fmt: skip
    async with session.post(url, json=body, headers={"X-Request-Id": call.request_id}) as resp:
        call.status = resp.status
        if not call.kind.endswith("_stream"):
            call.body = await resp.json()
            return
        async for line in resp.content:
            if line.startswith(b"data: "):
                call.events.append(line[6:].decode().strip())
                if leave_after is not None and len(call.events) >= leave_after:
                    resp.close()  # the client leaves mid-stream
                    return
        if leave_after is not None:
            call.problem = "a hung-up stream ended before its client left"


def _whole(call: Call) -> str | None:
    if call.status != 200:
        return f"status {call.status}"
    if call.kind == "generate_stream":
        last = json.loads(call.events[-1]) if call.events else {}
        return None if last.get("triton_final_response") is True else f"ends {call.events[-1:]}"
    if call.kind.endswith("_stream"):
        if call.events[-1:] != ["[DONE]"]:
            return f"no [DONE]: {call.events[-2:]}"
        finish = json.loads(call.events[-2])["choices"][0]["finish_reason"]
        return None if finish == "length" else f"finish_reason {finish}"
    assert call.body is not None
    usage = call.body["usage"]["completion_tokens"]
    return None if usage == SHORT else f"{usage} tokens of {SHORT}"


async def run_burst(url: str, calls: list[Call], concurrency: int, seed: int) -> float:
    """Every call through ``url``, ``concurrency`` at a time; the seconds it took."""
    rng = random.Random(seed + 1)
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(call: Call) -> None:
            async with gate:
                await run_call(session, url, call, rng)

        await asyncio.gather(*(one(call) for call in calls))
    return time.perf_counter() - started


@dataclass
class LoadSample:
    pod: int
    gauges: float  # vllm:num_requests_running + waiting, read before the listing
    listed: int  # GET /v2/requests
    gauges_after: float  # and after


async def sample_load(
    pods: list[Stack], stop: asyncio.Event, every: float = 0.05
) -> list[LoadSample]:
    """Each pod's protocol gauges beside its own call listing, every ``every`` seconds (the
    EPP's default interval: a sampling cadence, not a wait) until ``stop``."""
    samples = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            for i, pod in enumerate(pods):
                before = await _queue(session, pod.gateway_url)
                async with session.get(pod.gateway_url + "/v2/requests", headers=AUTH) as resp:
                    listed = len((await resp.json())["requests"])
                after = await _queue(session, pod.gateway_url)
                samples.append(LoadSample(i, before, listed, after))
            await asyncio.sleep(every)
    return samples


async def _queue(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics/pool") as resp:  # what an EPP is told to read
        samples = parse(await resp.text())
    return total(samples, "vllm:num_requests_running") + total(samples, "vllm:num_requests_waiting")


async def scrape_all(pods: list[Stack]) -> tuple[list[Samples], list[Samples]]:
    """Every pod's gateway and proxy metrics now."""
    async with aiohttp.ClientSession() as session:
        gateways, proxies = [], []
        for pod in pods:
            async with session.get(pod.gateway_url + "/metrics") as resp:
                gateways.append(parse(await resp.text()))
            async with session.get(pod.admin_url + "/metrics") as resp:
                proxies.append(parse(await resp.text()))
    return gateways, proxies


async def in_flight(pods: list[Stack]) -> list[int]:
    async with aiohttp.ClientSession() as session:
        counts = []
        for pod in pods:
            async with session.get(pod.gateway_url + "/v2/requests", headers=AUTH) as resp:
                counts.append(len((await resp.json())["requests"]))
    return counts


Records = dict[str, list[dict[str, Any]]]


def logged(pods: list[Stack]) -> tuple[Records, Records]:
    """Every pod's log lines about each call: the gateways' ``request_end`` lines (by call id)
    and the proxies' ``call`` lines (by request id)."""
    gateways: Records = {}
    proxies: Records = {}
    for pod in pods:
        for process, msg, key, into in ((pod.gateway, "request_end", "call_id", gateways),
                                        (pod.proxy, "call", "request_id", proxies)):  # fmt: skip
            for line in process.log().splitlines():
                if f'"msg": "{msg}"' not in line and f'"msg":"{msg}"' not in line:
                    continue
                record = json.loads(line)
                into.setdefault(str(record[key]), []).append(record)
    return gateways, proxies
