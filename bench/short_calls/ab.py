"""Benchmark: this tree's proxy against another tree's, CPU per short call (or per relayed
event), paired.

On a shared machine the CPU a call costs moves by up to a quarter between runs minutes apart,
more than most changes to the per-call path save. This runs both trees' proxies at once
(``--workers 1``, no quota) on one upstream and alternates short windows between them (the
order flipped every round), so both see the same machine; it prints each window and the median
of the paired differences. Start the other tree with ``git worktree add /tmp/base <commit>``.

``--triton``: both proxies are the Triton bridge (``--cancel-adapter triton``) in front of one
real Triton's gRPC port (``bench/harness/triton/server.py``), called as
``bench.short_calls.one_core`` calls it: the 1 KiB body to the ``slow`` model with no steps, which
answers at once. Triton's CPU is not counted; only each proxy's.

``--token``: both proxies run with a cancel token (``--cancel-token-file``), as the chart runs
them: every call is held by id for the proxy's own cancel API.

``--rate R``: the loops start R calls a second in all, on a schedule, instead of calling as fast
as answers come. At saturation a proxy's CPU per call depends on how many calls each turn of its
event loop serves, which moves with the upstream's speed (Triton's shares the machine's two
cores); at a fixed rate below both proxies' saturation both serve the same calls at the same
pace.

``--envoy``: Envoy (``--concurrency 1``) in front of the same upstream is a third lane of every
round, measured alike: the yardstick the proxy's figures are read against, in the same run.

``--events``: instead of short calls, CPU per relayed SSE event: each window, 64 streams of
events 10 ms apart (each event reaches the relay alone, as tokens do), 400 each
(``bench.proxy.overhead``'s ``saturate``); the window's seconds do not apply.

Printed: each round's figures, then per lane the median, and the paired differences (this tree
less the other, round by round) as their median and quartiles; with ``--envoy``, each proxy's
median ratio to Envoy's.

Run: ``.venv/bin/python -m bench.short_calls.ab --other /tmp/base`` (``--rounds 10``: about a
minute; ``--new-connections`` for a new connection per call instead of kept-alive; ``--triton``
for the bridge, about 90 s with Triton's start; ``--events --envoy``: about 20 s a round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.base.addresses import port_of
from bench.base.processes import REPO
from bench.harness.envoy import running_envoy
from bench.harness.triton.server import install, running_triton
from bench.instruments.sse_source import sources
from bench.instruments.stats import cpu_seconds
from bench.proxy.overhead import saturate
from bench.short_calls.free import window

TRITON_PATH = "/v2/models/slow/infer"


@dataclass(frozen=True)
class Upstream:
    """What both proxies are put in front of, and how they are called."""

    http: str  # host:port
    flags: Sequence[str] = ()  # the proxies' extra flags
    path: str = "/infer"


@contextlib.contextmanager
def upstream(triton: bool, work: Path) -> Iterator[Upstream]:
    """The answer-at-once source of ``bench.short_calls.load``, or a real Triton (its ``slow``
    model with no steps) with both proxies as its bridge."""
    if not triton:
        with sources(1, work) as (address, _):
            yield Upstream(address)
        return
    found = install()
    if isinstance(found, str):
        raise SystemExit(f"no Triton to run: {found}")
    with running_triton(work / f"triton-{time.monotonic_ns()}", found) as server:
        bridge = ["--cancel-adapter", "triton", "--upstream-grpc", server.grpc]
        yield Upstream(server.http, bridge, TRITON_PATH)


def _proxy(
    stack: contextlib.ExitStack, tree: Path, upstream: str, work: Path, flags: Sequence[str] = ()
) -> tuple[str, int]:
    """A proxy from ``tree`` (its address, its pid) with ``flags``, stopped when ``stack``
    closes."""
    ready = work / f"ready-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "proxy", "--http-port", "0", "--grpc-port", "0",
            "--admin-port", "0", "--log-level", "WARNING", "--upstream-http", f"http://{upstream}",
            "--max-concurrent-streams", "0", "--ready-file", str(ready), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proxy = subprocess.Popen(argv, cwd=tree, env=env, stderr=subprocess.DEVNULL)
    stack.callback(proxy.wait)
    stack.callback(proxy.terminate)
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, ValueError):
            listeners = json.loads(ready.read_text())
            return str(listeners["http"]), proxy.pid
        if proxy.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the proxy of {tree} did not start")
        time.sleep(0.05)


def _lanes(
    stack: contextlib.ExitStack, args: argparse.Namespace, up: Upstream, work: Path
) -> dict[str, tuple[str, int]]:
    """Each lane's address and the pid whose CPU is counted: both trees' proxies, and Envoy."""
    trees = {"this tree": REPO, "other": args.other.resolve()}
    flags = list(up.flags)
    if args.token:
        token = work / "token"
        token.write_text("bench-short-calls-token\n")
        flags += ["--cancel-token-file", str(token)]
    lanes = {name: _proxy(stack, tree, up.http, work, flags) for name, tree in trees.items()}
    if args.envoy:
        port = port_of(up.http)
        envoy = stack.enter_context(running_envoy(port, work / f"envoy-{time.monotonic_ns()}"))
        lanes["envoy"] = (envoy.address, envoy.popen.pid)
    return lanes


def _measure(args: argparse.Namespace, up: Upstream, address: str, pid: int) -> tuple[float, str]:
    """One window on one lane: CPU µs per call (or event), and its rate for the round's line."""
    if args.events:
        count, elapsed, (cpu,) = asyncio.run(
            saturate(address, 64, 400, lambda: [cpu_seconds(pid)], interval=0.01)
        )
        return 1e6 * cpu / max(1, count), f"{count / elapsed:,.0f} events/s"
    keep = not args.new_connections
    output, cpu = window(address, keep, 16, args.window, [pid], 0.5, up.path, args.rate)
    if output["errors"]:
        print(f"{address}: {output['errors']} errors in the window", flush=True)
    calls = int(str(output["calls"]))
    return 1e6 * cpu / max(1, calls), f"{calls / args.window:,.0f} calls/s"


def _quartiles(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{low:+.1f}..{high:+.1f}"


def _report(args: argparse.Namespace, costs: dict[str, list[float]]) -> None:
    ours, theirs = costs["this tree"], costs["other"]
    differences = [a - b for a, b in zip(ours, theirs, strict=True)]
    paired, base = statistics.median(differences), statistics.median(theirs)
    if args.events:
        kind = "relayed event"
    else:
        kind = ("kept-alive" if not args.new_connections else "new-connection") + " call"
        kind = ("bridged " if args.triton else "") + kind
        kind += " held (token)" if args.token else ""
        kind += f" (at {args.rate:g}/s)" if args.rate else ""
    medians = ", ".join(f"{name} {statistics.median(c):.1f}" for name, c in costs.items())
    print(f"CPU µs per {kind}, median: {medians}; paired difference {paired:+.1f} µs "
          f"({paired / base:+.1%}), quartiles {_quartiles(differences)} µs")  # fmt: skip
    if "envoy" in costs:
        for name in ("this tree", "other"):
            ratios = [a / e for a, e in zip(costs[name], costs["envoy"], strict=True)]
            print(f"  {name} / envoy, median of the rounds: {statistics.median(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window")
    parser.add_argument("--new-connections", action="store_true")
    parser.add_argument("--triton", action="store_true", help="the Triton bridge, to a real Triton")
    parser.add_argument("--rate", type=float, default=0.0, help="calls a second (0: saturate)")
    parser.add_argument("--token", action="store_true", help="a cancel token, as the chart sets")
    parser.add_argument("--envoy", action="store_true", help="Envoy as a third lane")
    parser.add_argument("--events", action="store_true", help="CPU per relayed SSE event")
    args = parser.parse_args()
    if args.triton and (args.envoy or args.events):
        parser.error("--triton takes neither --envoy nor --events")
    work = REPO / ".demo" / "bench-short-calls-ab"
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(upstream(args.triton, work))
        lanes = _lanes(stack, args, up, work)
        costs: dict[str, list[float]] = {name: [] for name in lanes}
        for round_ in range(args.rounds):
            order = list(lanes)[round_ % len(lanes) :] + list(lanes)[: round_ % len(lanes)]
            order = order if round_ % 2 == 0 else list(reversed(order))
            rates = {}
            for name in order:
                cost, rates[name] = _measure(args, up, *lanes[name])
                costs[name].append(cost)
            print(f"round {round_ + 1}: " + ", ".join(
                f"{name} {costs[name][-1]:.1f} µs ({rates[name]})" for name in lanes
            ), flush=True)  # fmt: skip
        _report(args, costs)


if __name__ == "__main__":
    main()
