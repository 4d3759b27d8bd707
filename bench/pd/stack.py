"""What ``bench.pd.cancel`` runs against and reads: a gateway with two vLLM workers on the tiny
model (``--worker-roles prefill,decode`` or ``both,both``) with ``hangup-proxy`` in front, the
gateway's metrics and call list, AIPerf as a subprocess, and the check that a gateway has
nothing left after a run (no call in flight, both workers' KV caches empty, no handoff held:
gauges at 0 and the handoff store's directory empty)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.base.processes import REPO, Process, spawn
from bench.base.scrape import Samples, delta, scrape_async, total
from bench.harness.vllm_stack import MODEL, WORKERS, vllm_gateway
from bench.instruments.aiperf_export import AiperfRun, read_run
from bench.pd.report import PHASES

CANCELLATIONS = "hangup_gateway_cancellations_total"
PROXY_CANCEL_CALLS = "hangup_proxy_cancel_calls_total"
CANCEL_RESULTS = ("ok", "finished", "not_found", "error", "gave_up")
IDLE_WITHIN_S = 15.0


@dataclass
class Stack:
    """One gateway (its two vLLM workers) and the proxy in front of it."""

    name: str
    gateway: Process
    proxy: Process
    store_parent: Path  # the gateway's TMPDIR: the handoff store is a directory in it

    @property
    def url(self) -> str:
        """Where clients send calls: the proxy."""
        return self.proxy.url()

    @property
    def gateway_url(self) -> str:
        return self.gateway.url()

    @property
    def proxy_admin(self) -> str:
        return self.proxy.url("admin")

    def store_files(self) -> set[str]:
        """Files in the handoff store now (none for an aggregated gateway, which has none)."""
        return {f.name for store in self.store_parent.glob("hangup-kv-handoff-*")
                for f in store.iterdir()}  # fmt: skip


@contextlib.contextmanager
def pd_stack(name: str, roles: str, model: Path, work: Path) -> Iterator[Stack]:
    """A gateway with ``roles`` (two workers) and a proxy, under ``work / name``."""
    tmp = work / name
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(parents=True, exist_ok=True)
    extra = ["--worker-roles", roles]  # logs at INFO: a line per request, with its phase
    with vllm_gateway(model, tmp, 2, extra=extra, env={"TMPDIR": str(tmpdir)}) as gateway:
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--upstream-http", gateway.url(), "--upstream-grpc", gateway.listeners["grpc"],
                "--trust-client-request-id", "--log-level", "WARNING"]  # fmt: skip
        with spawn("proxy", args, tmp / "proxy") as proxy:
            yield Stack(name, gateway, proxy, tmpdir)
            proxy.terminate()


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def calls(session: aiohttp.ClientSession, gateway_url: str) -> list[dict[str, object]]:
    """``GET /v2/requests``: the calls the gateway runs now."""
    async with session.get(gateway_url + "/v2/requests") as response:
        return list((await response.json())["requests"])


async def leftovers(
    session: aiohttp.ClientSession, stack: Stack, known: AbstractSet[str] = frozenset()
) -> dict[str, float]:
    """What the gateway still holds: calls, per worker running/waiting requests and KV use,
    the handoff gauges and files (but those in ``known``, left before). All 0 once everything
    was freed."""
    samples = await scrape_async(session, stack.gateway_url)
    held = {"calls": float(len(await calls(session, stack.gateway_url)))}
    for worker in WORKERS:
        held[f"busy_{worker}"] = total(
            samples, "hangup_gateway_engine_running_requests", worker=worker
        ) + total(samples, "hangup_gateway_engine_waiting_requests", worker=worker)
        held[f"kv_{worker}"] = total(
            samples, "hangup_gateway_engine_kv_cache_usage_ratio", worker=worker
        )
    held["handoff_kv_blocks"] = total(samples, "hangup_gateway_handoff_kv_blocks")
    held["handoffs_in_flight"] = total(samples, "hangup_gateway_handoffs_in_flight")
    held["store_files"] = float(len(stack.store_files() - known))
    return held


async def wait_freed(
    session: aiohttp.ClientSession, stack: Stack, known: AbstractSet[str] = frozenset()
) -> tuple[float, dict[str, float]]:
    """Seconds until nothing is left (NaN if something still is after ``IDLE_WITHIN_S``), and
    what was left at the last look; handoff files in ``known`` were there before."""
    t0 = time.monotonic()
    while True:
        held = await leftovers(session, stack, known)
        if not any(held.values()):
            return time.monotonic() - t0, held
        if time.monotonic() - t0 > IDLE_WITHIN_S:
            return float("nan"), held
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def phase_trace(
    session: aiohttp.ClientSession, gateway_url: str, every_s: float = 0.02
) -> AsyncIterator[dict[str, dict[str, float]]]:
    """While inside: each call's phases as ``GET /v2/requests`` shows them, polled every
    ``every_s``: call id -> {phase: when first seen, ``last``: when last seen}
    (``time.monotonic()``). A phase shorter than a poll may not be seen (its time then counts
    in the phase before it). Raises RuntimeError if a poll failed."""
    seen: dict[str, dict[str, float]] = {}

    async def poll() -> None:
        while True:
            listed = await calls(session, gateway_url)
            now = time.monotonic()
            for call in listed:
                times = seen.setdefault(str(call["request_id"]), {})
                times.setdefault(str(call["phase"]), now)
                times["last"] = now
            await asyncio.sleep(every_s)

    task = asyncio.create_task(poll())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if not task.cancelled() and (error := task.exception()) is not None:
        raise RuntimeError(f"the phase trace stopped early: {error!r}") from error


def slowest(seen: dict[str, dict[str, float]]) -> dict[str, float]:
    """The call seen longest in a :func:`phase_trace`: seconds it was seen in, and spent in each
    phase (from one phase's first sighting to the next's; the last to its last sighting)."""
    if not seen:
        return {}
    times = max(seen.values(), key=lambda t: t["last"] - min(t.values()))
    order = sorted((t, p) for p, t in times.items() if p != "last")
    spent = {phase: after - at for (at, phase), (after, _) in itertools.pairwise(order)}
    spent[order[-1][1]] = times["last"] - order[-1][0]
    return {"seen_s": times["last"] - order[0][0], **spent}


def cancellations(after: Samples, before: Samples) -> dict[str, float]:
    """The gateway's cancellations between two scrapes, per phase (every reason)."""
    return {phase: delta(after, before, CANCELLATIONS, phase=phase) for phase in PHASES}


def reasons(after: Samples, before: Samples) -> dict[str, float]:
    """The same, per reason."""
    names = {dict(labels).get("reason", "") for (name, labels) in after if name == CANCELLATIONS}
    counts = {r: delta(after, before, CANCELLATIONS, reason=r) for r in sorted(names)}
    return {r: n for r, n in counts.items() if n}


def cancel_calls(after: Samples, before: Samples) -> dict[str, float]:
    """The proxy's cancel calls between two scrapes of its admin port, by how each ended."""
    counts = {r: delta(after, before, PROXY_CANCEL_CALLS, result=r) for r in CANCEL_RESULTS}
    return {r: n for r, n in counts.items() if n}


def aiperf(args: argparse.Namespace, url: str, out: Path, *, requests: int, concurrency: int,
           cancel_delay: float | None = None, warmup: int = 0) -> AiperfRun:  # fmt: skip
    """One AIPerf run of ``requests`` streaming completions against ``url``, ``concurrency``
    at a time; with ``cancel_delay`` it cancels ``--cancel-rate`` percent of them that many
    seconds after each is sent."""
    command = [
        str(args.aiperf), "profile", "--model", MODEL, "--url", url,
        "--endpoint-type", "completions", "--streaming", "--tokenizer", str(args.model),
        "--concurrency", str(concurrency), "--request-count", str(requests),
        "--prompt-input-tokens-mean", str(args.input_tokens), "--prompt-input-tokens-stddev", "0",
        "--extra-inputs", f"max_tokens:{args.output_tokens}", "--extra-inputs", "ignore_eos:true",
        "--no-server-metrics", "--no-gpu-telemetry", "--ui", "none",
        "--output-artifact-dir", str(out), "--random-seed", "1",
    ]  # fmt: skip
    if cancel_delay is not None:
        command += ["--request-cancellation-rate", str(args.cancel_rate),
                    "--request-cancellation-delay", f"{cancel_delay:.3f}"]  # fmt: skip
    if warmup:
        command += ["--warmup-request-count", str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    (out / "aiperf.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "aiperf.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"aiperf exited with {done.returncode}:\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")  # fmt: skip
    return read_run(out)


def dump(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, default=str))
