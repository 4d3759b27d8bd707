"""Benchmark: three pods behind LiteLLM, which does not pass a hang-up on, and an edge proxy whose
cancel finds the pod (``--cancel-pool``).

Three pods on 127.0.0.1, each a simulated gateway and its sidecar (``--trust-client-request-id``:
the id the edge chose is the gateway's); LiteLLM's proxy in front of the three sidecars
(``docs/front-doors/litellm.yaml``, ``cancel_on_disconnect`` off, its default; it forwards
``X-Request-Id``); hangup's proxy at the edge in front of LiteLLM. ``--calls`` calls that do not
stream, each closed by its client after 0.3 s of decoding, one at a time, with the edge's cancel
target:

- ``litellm``: the edge's upstream, LiteLLM, which has no cancel API (what an edge does without
  ``--cancel-pool``);
- ``pool``: ``--cancel-pool`` naming the three sidecars (which relay the cancel to their gateway).

Per row: the hang-ups cancelled on a pod (the pods' ``client_disconnect`` cancellations, summed),
the edge's cancel results, the pool members asked per cancel, and the time from the client's close
to the pod's count (p50/p99 ms, polled every 5 ms; not within 5 s: the call is cancelled through a
pod's cancel API so that the next starts on idle pods).

Run: ``.venv/bin/python -m bench.litellm_edge`` (needs ``.venv-litellm``, which
``make bench-front-doors`` installs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.stats import median_p99
from tests.support.front_doors import cancelled, hang_up, idle, running_front_door
from tests.support.processes import REPO, Process, spawn
from tests.support.scrape import scrape, total


@contextlib.contextmanager
def pods(work: Path, count: int) -> Iterator[list[tuple[Process, Process]]]:
    with contextlib.ExitStack() as stack:
        found = []
        for i in range(count):
            gateway_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0"]
            gateway = stack.enter_context(spawn("gateway_server", gateway_args, work / f"g{i}"))
            sidecar_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                            "--upstream-http", gateway.url(),
                            "--trust-client-request-id", "true"]  # fmt: skip
            found.append(
                (gateway, stack.enter_context(spawn("proxy", sidecar_args, work / f"s{i}")))
            )
        yield found


def edge_results(edge: Process) -> dict[str, float]:
    samples = scrape(edge.url("admin"))
    results = {r: total(samples, "hangup_proxy_cancel_calls_total", result=r)
               for r in ("ok", "finished", "not_found", "error", "gave_up")}  # fmt: skip
    results["asked"] = total(samples, "hangup_proxy_cancel_pool_members_sum")
    return results


async def run_row(
    edge: Process, gateways: list[Process], calls: int
) -> tuple[int, list[float], dict[str, float]]:
    url = f"{edge.url()}/v1/chat/completions"
    seen_ms: list[float] = []
    before_edge = edge_results(edge)
    for _ in range(calls):
        before = sum(cancelled(g) for g in gateways)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            gone, _ = await hang_up(session, url, "decode")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if sum(cancelled(g) for g in gateways) > before:
                seen_ms.append(1000 * (time.time() - gone))
                break
            await asyncio.sleep(0.005)
        for gateway in gateways:
            await idle(gateway)
    after_edge = edge_results(edge)
    return len(seen_ms), seen_ms, {k: after_edge[k] - before_edge[k] for k in after_edge}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    work = REPO / ".demo" / f"bench-litellm-edge-{time.time_ns()}"
    with pods(work, 3) as found:
        gateways = [g for g, _ in found]
        ports = [int(s.url().rsplit(":", 1)[1]) for _, s in found]
        with running_front_door("litellm", work / "litellm", ports) as litellm:
            pool = ",".join(s.url() for _, s in found)
            print(f"{'cancel target':>14} {'cancelled on a pod':>18} {'close→cancel ms':>15}"
                  f" {'edge: ok/not_found/gave_up':>26} {'members asked':>13}")  # fmt: skip
            for target in ("litellm", "pool"):
                edge_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                             "--upstream-http", litellm]  # fmt: skip
                if target == "pool":
                    edge_args += ["--cancel-pool", pool]
                with spawn("proxy", edge_args, work / f"edge-{target}") as edge:
                    done, seen_ms, results = await run_row(edge, gateways, args.calls)
                    seen = median_p99(seen_ms, 0) if seen_ms else "never"
                    edge_line = (f"{results['ok']:.0f}/{results['not_found']:.0f}/"
                                 f"{results['gave_up']:.0f}")  # fmt: skip
                    print(f"{target:>14} {done:>11}/{args.calls:<6} {seen:>15} {edge_line:>26}"
                          f" {results['asked']:>13.0f}", flush=True)  # fmt: skip
                    edge.terminate()


if __name__ == "__main__":
    asyncio.run(main())
