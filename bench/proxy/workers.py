"""Benchmark: relaying token-like SSE streams with more than one core, side by side in one run:
hangup ``--workers 1`` and ``--workers 2``, Envoy ``--concurrency 1`` and ``2``, and no proxy.

The source (``bench/instruments/sse_source.py``, ``--sources`` processes sharing one port) writes
each event separately, as an engine streams tokens; the client is this process (raw asyncio
connections, ``bench.proxy.overhead``'s). For each path and stream count: events/s at
saturation, and CPU ms per 1000 events of the relay (every process of it: hangup's supervisor
and workers), of the source and of the client. Where the cores went is printed too: if relay,
source and client together use every core, the machine, not the relay, is the limit, and the
events/s ratio of 2 workers over 1 says nothing about scaling; the relay's CPU per event still
does (it is what a pod pays per token).

``--interval S`` paces each stream's events S seconds apart, as an engine streams tokens: each
event then reaches the relay alone (a saturating source lets events coalesce into one read), so
CPU per event is what a relay pays per token; events/s is then the source's pace, not a limit.

Run: ``.venv/bin/python -m bench.proxy.workers`` (``--streams 64,256 --events 60000``;
``--interval 0.02`` for paced streams).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from bench.base.addresses import port_of
from bench.base.processes import REPO, Process, children, spawn
from bench.harness.envoy import running_envoy
from bench.instruments.sse_source import sources
from bench.instruments.stats import cpu_of
from bench.proxy.overhead import run, saturate


async def measure(
    address: str,
    relay: list[int],
    sources: list[int],
    streams: int,
    events: int,
    interval: float = 0.0,
) -> dict[str, float]:
    """Events/s, and CPU ms per 1000 events of the relay, the source and the client."""

    def clock() -> list[float]:
        return [cpu_of(relay), cpu_of(sources), time.process_time()]

    count, elapsed, spent = await saturate(address, streams, events // streams, clock, interval)
    per_k = [1e6 * cpu / count for cpu in spent]
    return {"rate": count / elapsed, "relay": per_k[0], "source": per_k[1],
            "client": per_k[2], "busy": sum(spent) / elapsed}  # fmt: skip


def _pids(process: Process) -> list[int]:
    return [process.popen.pid, *children(process.popen.pid)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="64,256")
    parser.add_argument("--events", type=int, default=60000, help="events per measurement")
    parser.add_argument("--sources", type=int, default=2, help="source processes")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per path")
    parser.add_argument("--interval", type=float, default=0.0,
                        help="seconds between a stream's events (0: at once)")  # fmt: skip
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-proxy-workers"
    print(f"{os.cpu_count()} cores; {args.sources} source processes", flush=True)
    with contextlib.ExitStack() as stack:
        address, source_pids = stack.enter_context(sources(args.sources, work))
        upstream = f"http://{address}"
        port = port_of(address)
        paths: dict[str, tuple[str, list[int]]] = {"direct": (address, [])}
        for workers in (1, 2):
            px = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                  "--log-level", "WARNING", "--upstream-http", upstream,
                  "--max-concurrent-streams", "0", "--workers", str(workers)]  # fmt: skip
            proxy = stack.enter_context(spawn("proxy", px, work / f"hangup-{workers}"))
            paths[f"hangup --workers {workers}"] = (proxy.listeners["http"], _pids(proxy))
        for threads in (1, 2):
            envoy = stack.enter_context(
                running_envoy(port, work / f"envoy-{threads}", concurrency=threads)
            )
            paths[f"envoy --concurrency {threads}"] = (envoy.address, [envoy.popen.pid])
        for streams in (int(s) for s in args.streams.split(",")):
            results: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
            for _ in range(args.rounds):  # alternate, so drift on a shared machine hits all
                for name, (target, relay) in paths.items():
                    result = await measure(
                        target, relay, source_pids, streams, args.events, args.interval
                    )
                    results[name].append(result)
            report(streams, results)


def report(streams: int, results: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{streams} streams: events/s (best of rounds); CPU ms per 1k events: relay, source,"
          " client; cores busy")  # fmt: skip
    for name, rounds in results.items():
        best = max(rounds, key=lambda r: r["rate"])
        relay = min(r["relay"] for r in rounds)
        print(f"  {name:>22}: {best['rate']:>7.0f}/s   relay {relay:5.1f}   source"
              f" {best['source']:5.1f}   client {best['client']:5.1f}"
              f"   busy {best['busy']:.2f}")  # fmt: skip


if __name__ == "__main__":
    run(main())
