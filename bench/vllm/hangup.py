"""Benchmark: a client hangs up on the real vLLM engine (CPU, tiny local model). What does the
engine do next, through hangup and through vLLM's own OpenAI server?

Setups (one at a time, each with the same engine options):

- ``hangup``: ``hangup-gateway --engine vllm``, one worker, the client talks to it directly;
- ``hangup+proxy``: ``hangup-proxy`` in front of that gateway;
- ``vllm``: vLLM's OpenAI server (what ``vllm serve`` runs), direct;
- ``vllm+envoy``: ``vllm serve`` behind Envoy (a plain HTTP route, timeouts off);
- ``vllm+hangup``: ``vllm serve`` behind ``hangup-proxy --cancel-adapter vllm`` (a hang-up closes
  the upstream stream);
- ``vllm+hangup-abort``: the same with ``--vllm-abort-endpoint`` (the server in
  ``VLLM_SERVER_DEV_MODE``; the proxy also calls ``POST /abort_requests``).

Scenarios: streaming and non-streaming completions that hang up in *prefill* (a ~7,400-token
prompt prefilled in 64-token chunks: the client hangs up once the server reports the request
running and holding KV cache, before any output token) and in *decode* (after 20 output tokens).
The client is aiohttp; hanging up closes its TCP connection. ``--api responses`` runs the same
scenarios as Responses calls (``POST /v1/responses``, not background), on the setups that serve it.

Measured per hang-up, from each server's own ``/metrics`` (polled every few ms; both count the
tokens the engine delivered to its front end):

- **tokens after hang-up**: output tokens counted after the hang-up (generated-tokens counter at
  the end minus its value read just before the hang-up);
- **hang-up → freed**: the hang-up → the first scrape showing no running request and an empty KV
  cache (includes up to one polling interval and a scrape; the median scrape time of each
  server is printed). A request the server does not abort runs to ``max_tokens`` and counts as
  *not aborted*.

Run: ``.venv/bin/python -m bench.vllm.hangup`` (``--reps 3 --setups hangup,vllm`` to shorten;
``--api responses --setups vllm,vllm+hangup,vllm+hangup-abort`` for Responses calls).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import port_of
from bench.base.processes import spawn
from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.envoy import running_envoy
from bench.harness.vllm_stack import ENGINE_ARGS, LONG_PROMPT, MODEL, make_tiny_model, vllm_serve

DECODE_TOKENS_BEFORE_HANGUP = 20
MAX_TOKENS = 1500
PREFILL_MAX_TOKENS = 500  # the long prompt plus this fits the 8192-token context
POLL_S = 0.003
VLLM_FRONTS = ("vllm", "vllm+envoy", "vllm+hangup", "vllm+hangup-abort")
Gauge = tuple[str, tuple[tuple[str, str], ...]]
Readings = dict[Gauge, float]


@dataclass(frozen=True)
class Gauges:
    """Where a server's /metrics says what its engine is doing: a name and the labels a sample
    must carry (the samples that do are summed: vLLM labels by model name)."""

    running: Gauge
    kv: Gauge
    generated: Gauge


HANGUP_GAUGES = Gauges(
    ("hangup_gateway_engine_running_requests", (("worker", "0"),)),
    ("hangup_gateway_engine_kv_cache_usage_ratio", (("worker", "0"),)),
    ("hangup_gateway_generated_tokens_total", (("model", MODEL),)),
)
VLLM_GAUGES = Gauges(
    ("vllm:num_requests_running", ()),
    ("vllm:kv_cache_usage_perc", ()),
    ("vllm:generation_tokens_total", ()),
)


@dataclass(frozen=True)
class Api:
    """The OpenAI route the scenarios call: its path, how a request names its prompt and output
    length, and the SSE line that marks one streamed token."""

    path: str
    prompt_field: str
    max_field: str
    token_line: bytes

    def body(self, prompt: str, max_tokens: int, stream: bool) -> dict[str, object]:
        return {"model": MODEL, self.prompt_field: prompt, self.max_field: max_tokens,
                "stream": stream, "ignore_eos": True, "temperature": 1.0}  # fmt: skip


APIS = {
    "completions": Api("/v1/completions", "prompt", "max_tokens", b"data: {"),
    "responses": Api(
        "/v1/responses", "input", "max_output_tokens", b"event: response.output_text.delta"
    ),
}


@dataclass
class Target:
    name: str
    url: str  # where the client sends completions
    metrics_url: str  # the engine's server
    gauges: Gauges


@dataclass
class Result:
    tokens_after: list[float] = field(default_factory=list)
    freed_ms: list[float] = field(default_factory=list)
    not_aborted: int = 0


async def scrape(session: aiohttp.ClientSession, target: Target) -> Readings:
    samples = await scrape_async(session, target.metrics_url)
    g = target.gauges
    return {
        gauge: total(samples, gauge[0], **dict(gauge[1]))
        for gauge in (g.running, g.kv, g.generated)
    }


async def wait_idle(session: aiohttp.ClientSession, target: Target) -> Readings:
    async def idle() -> Readings:
        s = await scrape(session, target)
        return {} if s[target.gauges.running] or s[target.gauges.kv] else s

    return await wait_until(idle, 120.0, f"{target.name}: the engine to go idle")


async def one_hangup(
    session: aiohttp.ClientSession, target: Target, api: Api, *, stream: bool, phase: str
) -> tuple[float, float | None]:
    """One request that hangs up in ``phase``; returns (tokens after hang-up, ms to freed)."""
    g = target.gauges
    before = await wait_idle(session, target)
    prompt = LONG_PROMPT if phase == "prefill" else "Hello"
    max_tokens = PREFILL_MAX_TOKENS if phase == "prefill" else MAX_TOKENS
    body = api.body(prompt, max_tokens, stream)
    post = asyncio.ensure_future(session.post(target.url + api.path, json=body))
    events = 0
    at_hangup: Readings = {}
    while True:
        if post.done() and post.result().status != 200:
            raise RuntimeError(f"{target.name}: {await post.result().text()}")
        s = await scrape(session, target)
        produced = s.get(g.generated, 0.0) - before.get(g.generated, 0.0)
        if phase == "prefill" and s.get(g.running) and s.get(g.kv) and not produced:
            at_hangup = s
            break
        if phase == "prefill" and produced:
            raise RuntimeError(f"{target.name}: prefill ended before the hang-up; slow it down")
        if phase == "decode" and not stream and produced >= DECODE_TOKENS_BEFORE_HANGUP:
            at_hangup = s
            break
        if phase == "decode" and stream and post.done():
            response = post.result()
            async for line in response.content:
                events += line.startswith(api.token_line)
                if events >= DECODE_TOKENS_BEFORE_HANGUP:
                    break
            at_hangup = await scrape(session, target)
            break
        await asyncio.sleep(POLL_S)
    hung_up = time.perf_counter()
    if post.done():
        post.result().close()
    else:
        post.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await post
    freed = None
    while time.perf_counter() - hung_up < 60:
        s = await scrape(session, target)
        if not s.get(g.running) and not s.get(g.kv):
            freed = (time.perf_counter() - hung_up) * 1000
            break
        await asyncio.sleep(POLL_S)
    after = s.get(g.generated, 0.0) - at_hangup.get(g.generated, 0.0)
    generated = s.get(g.generated, 0.0) - before.get(g.generated, 0.0)
    return after, (freed if generated < max_tokens else None)


async def run_target(target: Target, reps: int, api: Api) -> dict[str, Result]:
    results: dict[str, Result] = {}
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        durations = []
        for _ in range(30):
            started = time.perf_counter()
            await scrape(session, target)
            durations.append((time.perf_counter() - started) * 1000)
        print(f"  {target.name:12} one /metrics scrape: {statistics.median(durations):.1f} ms "
              f"median (part of every hang-up → freed figure)", flush=True)  # fmt: skip
        for phase in ("prefill", "decode"):
            for stream in (False, True):
                key = f"{'streaming' if stream else 'non-streaming'} / {phase}"
                result = results[key] = Result()
                for _ in range(reps):
                    after, freed = await one_hangup(
                        session, target, api, stream=stream, phase=phase
                    )
                    result.tokens_after.append(after)
                    if freed is None:
                        result.not_aborted += 1
                    else:
                        result.freed_ms.append(freed)
                print(f"  {target.name:12} {key:26} {summary(result)}", flush=True)
        if target.gauges is HANGUP_GAUGES:
            print(f"  {target.name:12} {await cancel_to_abort(session, target)}", flush=True)
    return results


async def cancel_to_abort(session: aiohttp.ClientSession, target: Target) -> str:
    """The gateway's own cancel → abort-confirmed histogram, as a mean over the run."""
    samples = await scrape_async(session, target.metrics_url)
    name = "hangup_gateway_cancel_to_abort_seconds"
    count, seconds = total(samples, f"{name}_count"), total(samples, f"{name}_sum")
    if not count:
        return "cancel → abort confirmed: no sample"
    return (
        f"cancel → abort confirmed (gateway histogram): mean {seconds / count * 1000:.2f} ms over "
        f"{count:.0f} cancels"
    )


def summary(r: Result) -> str:
    def med_max(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):{fmt}} / {max(values):{fmt}}"

    aborted = len(r.freed_ms)
    return (f"tokens after {med_max(r.tokens_after, '.0f')}  freed ms {med_max(r.freed_ms, '.1f')}"
            f"  aborted {aborted}/{aborted + r.not_aborted}")  # fmt: skip


# -- servers -------------------------------------------------------------------------------------


@contextlib.contextmanager
def envoy(upstream: str, tmp: Path) -> Iterator[str]:
    """Envoy in front of ``upstream`` (the proxy benchmarks' config: ``bench/harness/envoy.py``)."""
    with running_envoy(port_of(upstream), tmp / "envoy") as proxy:
        yield proxy.url


def targets(model: Path, tmp: Path, names: list[str]) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, context manager factory yielding a Target) for each setup asked for."""

    @contextlib.contextmanager
    def hangup(with_proxy: bool) -> Iterator[Target]:
        args = ["--engine", "vllm", "--model", str(model), "--served-model-name", MODEL,
                "--http-port", "0", "--grpc-port", "0", *ENGINE_ARGS]  # fmt: skip
        with spawn("gateway_server", args, tmp / "gateway", timeout=600) as gw:
            gateway = gw.url()
            if not with_proxy:
                yield Target("hangup", gateway, gateway, HANGUP_GAUGES)
            else:
                proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                              "--upstream-http", gateway]  # fmt: skip
                with spawn("proxy", proxy_args, tmp / "proxy", timeout=60) as px:
                    yield Target("hangup+proxy", px.url(), gateway, HANGUP_GAUGES)
            gw.terminate(60)

    @contextlib.contextmanager
    def vllm(front: str) -> Iterator[Target]:
        dev_mode = front == "vllm+hangup-abort"
        with vllm_serve(model, tmp, ENGINE_ARGS, dev_mode=dev_mode) as url:
            if front == "vllm":
                yield Target("vllm", url, url, VLLM_GAUGES)
            elif front == "vllm+envoy":
                with envoy(url, tmp) as proxy_url:
                    yield Target(front, proxy_url, url, VLLM_GAUGES)
            else:
                abort = "--vllm-abort-endpoint" if dev_mode else "--no-vllm-abort-endpoint"
                proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                              "--upstream-http", url, "--cancel-adapter", "vllm",
                              abort]  # fmt: skip
                with spawn("proxy", proxy_args, tmp / front, timeout=60) as px:
                    yield Target(front, px.url(), url, VLLM_GAUGES)

    for name in names:
        if name in VLLM_FRONTS:
            yield name, functools.partial(vllm, name)
        else:
            yield name, functools.partial(hangup, name == "hangup+proxy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--setups", default=",".join(["hangup", "hangup+proxy", *VLLM_FRONTS]))
    parser.add_argument("--model", type=Path, help="a model directory (default: a fresh tiny one)")
    parser.add_argument("--api", choices=sorted(APIS), default="completions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangup-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model = args.model or make_tiny_model(tmp / "tiny")
        table: dict[str, dict[str, Result]] = {}
        for name, factory in targets(model, tmp, args.setups.split(",")):
            print(f"{name}: starting", flush=True)
            try:
                with factory() as target:
                    table[name] = asyncio.run(run_target(target, args.reps, APIS[args.api]))
            except (RuntimeError, TimeoutError) as exc:
                print(f"{name}: skipped: {str(exc).splitlines()[0]}", flush=True)
        print(
            "\n| setup | request / hang-up in | tokens after hang-up, median / max "
            "| hang-up → freed ms, median / max | aborted |"
        )
        print("|---|---|---:|---:|---:|")
        for name, rows in table.items():
            for key, r in rows.items():
                cells = summary(r).replace("tokens after ", "").replace("freed ms ", "|")
                tokens, rest = cells.split("|", 1)
                freed, aborted = rest.split("  aborted ")
                print(f"| {name} | {key} | {tokens.strip()} | {freed.strip()} | {aborted} |")


if __name__ == "__main__":
    main()
