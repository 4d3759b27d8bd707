"""The chaos soak: mixed traffic through the proxy while faults are injected (``faults.Pod``).

Each phase runs ``concurrency`` clients for ``seconds``; once they have made ``FIRE_AFTER`` calls
each (the traffic under way), its fault fires; a client whose call ended while the fault was
under way makes its next call once the fault is over, and the phase lasts at least a third of
``seconds`` after its fault:

    none            nothing (the baseline)
    reset_upstream  every proxy → gateway connection reset (TCP RST both ways)
    stop_gateway    the gateway SIGSTOPped until the proxy has given up on the cancels of
                    calls that hung up meanwhile (past its cancel deadline), then SIGCONT
    kill_gateway    the gateway (its process group) SIGKILLed and restarted
    kill_engine     the gateway's engine killed through its fault switch (as SIGKILL kills a vLLM
                    engine core); the fault lasts until the gateway has started it again
    hang_engine     the engine hung (the switch's ``hang``, as SIGSTOP stops a vLLM engine core)
                    until the proxy has given up on the cancels of calls that hung up meanwhile,
                    then resumed
    drain_gateway   the gateway SIGTERMed (it drains) and restarted
    kill_proxy_worker  one of the proxy's two worker processes SIGKILLed (its supervisor
                    starts another)
    kill_proxy      the whole proxy SIGKILLed and restarted (as Kubernetes restarts a container)
    drain_proxy     the proxy SIGTERMed (it drains) and restarted

With vLLM (``Pod(engine="vllm")``) the faults are ``VLLM_FAULTS``: ``kill_engine`` and
``hang_engine`` signal the engine core itself (SIGKILL; SIGSTOP, then SIGCONT), and the gateway is
drained in its own process group, nothing of which may outlive it (``leftovers``).

Here: the faults, each as the action its phase takes (``_fault``), and the phases that run them
(``run_phase``, ``run_schedule``). The traffic (the clients and their calls) is
``chaos_traffic.py``; what each phase found once the pod settled, and the checks on it,
``chaos_report.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.chaos_report import PhaseReport, settle, summary
from bench.harness.chaos_traffic import HANG_UP_TOKENS, Client, Request, http_call, references
from bench.harness.faults import Pod
from bench.harness.stack import MODEL
from bench.harness.vllm_stack import ENGINE_ARGS

FAULTS = ("none", "reset_upstream", "stop_gateway", "kill_gateway", "kill_engine", "hang_engine",
          "drain_gateway", "kill_proxy_worker", "kill_proxy", "drain_proxy")  # fmt: skip
VLLM_FAULTS = ("none", "kill_engine", "hang_engine", "drain_gateway")

CANCEL_DEADLINE_S = 2.0  # the proxy's --cancel-deadline in the soak
PROXY_ARGS = ["--workers", "2", "--cancel-deadline", str(CANCEL_DEADLINE_S), "--drain-timeout", "3"]
FIRE_AFTER = 2  # calls per client before the phase's fault fires
STOPPED_HANG_UPS = 4  # calls that hang up while the gateway is stopped (their cancels give up)


def vllm_gateway_args(model: str) -> list[str]:
    """A one-worker vLLM gateway on the tiny ``model`` with the vLLM tier's CPU engine options
    (prefill in chunks of 64 tokens, a 16 MiB KV cache), draining for 3 s."""
    return ["--model", model, "--served-model-name", MODEL, "--workers", "1", *ENGINE_ARGS,
            "--drain-timeout", "3"]  # fmt: skip


def _fault(pod: Pod, session: aiohttp.ClientSession, name: str) -> Callable[[], Awaitable[str]]:
    async def reset() -> str:
        return pod.reset_upstream()

    async def nothing() -> str:
        return "no fault"

    async def gave_up() -> float:
        assert pod.proxy is not None
        samples = await scrape_async(session, pod.proxy.url("admin"))
        return total(samples, "hangup_proxy_cancel_calls_total", result="gave_up")

    async def stop(
        pause: Callable[[], Awaitable[object]], resume: Callable[[], Awaitable[object]], what: str
    ) -> str:
        # While it is stopped, a few clients hang up for sure; it stays stopped until the proxy
        # has given up on that many cancels, i.e. past the proxy's cancel deadline.
        before, started = await gave_up(), time.monotonic()
        await pause()
        try:
            request = Request("completion_stream", "hang up", HANG_UP_TOKENS, None)
            for _ in range(STOPPED_HANG_UPS):
                calling = asyncio.ensure_future(http_call(session, pod.proxy_url, request))
                await asyncio.wait([calling], timeout=0.2)
                calling.cancel()
                await asyncio.gather(calling, return_exceptions=True)
            await wait_until(lambda: _grown(gave_up(), before + STOPPED_HANG_UPS),
                             within=CANCEL_DEADLINE_S + 10, what="cancels given up on")  # fmt: skip
        finally:
            await resume()
        return (f"{what} stopped until the proxy gave up on {STOPPED_HANG_UPS} cancels"
                f" ({time.monotonic() - started:.1f} s), then continued")  # fmt: skip

    async def pause_gateway() -> None:
        pod.pause_gateway()

    async def resume_gateway() -> None:
        pod.resume_gateway()

    async def restarts() -> float:
        samples = await scrape_async(session, pod.gateway_url)
        return total(samples, "hangup_gateway_engine_restarts_total")

    async def kill_engine() -> str:
        before, started = await restarts(), time.monotonic()
        what = await pod.engine_fault("kill")
        await wait_until(lambda: _grown(restarts(), before + 1), within=pod.gateway_start_s,
                         what="the killed engine started again")  # fmt: skip
        return f"{what}; serving again after {time.monotonic() - started:.1f} s"

    return {
        "none": nothing,
        "reset_upstream": reset,
        "stop_gateway": lambda: stop(pause_gateway, resume_gateway, "gateway"),
        "kill_engine": kill_engine,
        "hang_engine": lambda: stop(
            lambda: pod.engine_fault("hang"), lambda: pod.engine_fault("resume"), "engine"
        ),
        "drain_gateway": pod.drain_gateway,
        "kill_gateway": pod.kill_gateway,
        "kill_proxy_worker": pod.kill_proxy_worker,
        "kill_proxy": pod.kill_proxy,
        "drain_proxy": pod.drain_proxy,
    }[name]


async def run_phase(
    pod: Pod,
    session: aiohttp.ClientSession,
    expected: dict[Request, str],
    fault: str,
    *,
    seconds: float,
    concurrency: int,
    rng: random.Random,
) -> PhaseReport:
    report = PhaseReport(fault)
    started = time.monotonic()
    report.until = started + seconds
    clients = [
        Client(pod, session, expected, random.Random(rng.random()), report)
        for _ in range(concurrency)
    ]
    running = asyncio.gather(*(c.run() for c in clients))
    # The fault fires once the traffic is under way (FIRE_AFTER calls per client made).
    report.fire_after = FIRE_AFTER * concurrency
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(report.under_way.wait(), seconds)
    pod.steady.clear()
    try:
        report.what = await _fault(pod, session, fault)()
    finally:
        pod.steady.set()
    # A fault that outlasts the phase (an engine starting again) still gets calls after it.
    report.until = max(report.until, time.monotonic() + seconds / 3)
    await running
    report.seconds = time.monotonic() - started
    await settle(pod, session, report)
    return report


async def run_schedule(
    pod: Pod, schedule: list[str], *, seconds: float, concurrency: int, rng: random.Random
) -> list[PhaseReport]:
    """One phase per fault of ``schedule`` on ``pod`` (references made first); each report
    printed as its phase ends."""
    reports = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        expected = await references(pod, session)
        for fault in schedule:
            report = await run_phase(
                pod, session, expected, fault, seconds=seconds, concurrency=concurrency, rng=rng
            )
            print(summary(report))
            reports.append(report)
    return reports


async def _grown(value: Awaitable[float], at_least: float) -> bool:
    return await value >= at_least
