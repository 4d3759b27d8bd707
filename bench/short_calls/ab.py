"""Benchmark: this tree's proxy against another tree's, CPU per short call, paired.

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

Run: ``.venv/bin/python -m bench.short_calls.ab --other /tmp/base`` (``--rounds 10``: about a
minute; ``--new-connections`` for a new connection per call instead of kept-alive; ``--triton``
for the bridge, about 90 s with Triton's start).
"""

from __future__ import annotations

import argparse
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

from bench.base.processes import REPO
from bench.harness.triton.server import install, running_triton
from bench.instruments.sse_source import sources
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window")
    parser.add_argument("--new-connections", action="store_true")
    parser.add_argument("--triton", action="store_true", help="the Triton bridge, to a real Triton")
    parser.add_argument("--rate", type=float, default=0.0, help="calls a second (0: saturate)")
    parser.add_argument("--token", action="store_true", help="a cancel token, as the chart sets")
    args = parser.parse_args()
    keep = not args.new_connections
    work = REPO / ".demo" / "bench-short-calls-ab"
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(upstream(args.triton, work))
        trees = {"this tree": REPO, "other": args.other.resolve()}
        flags = list(up.flags)
        if args.token:
            token = work / "token"
            token.write_text("bench-short-calls-token\n")
            flags += ["--cancel-token-file", str(token)]
        proxies = {name: _proxy(stack, tree, up.http, work, flags) for name, tree in trees.items()}
        costs: dict[str, list[float]] = {name: [] for name in trees}
        calls: dict[str, int] = {}
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                address, pid = proxies[name]
                output, cpu = window(address, keep, 16, args.window, [pid], 0.5, up.path, args.rate)
                if output["errors"]:
                    print(f"{name}: {output['errors']} errors in the window", flush=True)
                calls[name] = int(str(output["calls"]))
                costs[name].append(1e6 * cpu / max(1, calls[name]))
            print(f"round {round_ + 1}: " + ", ".join(
                f"{name} {costs[name][-1]:.1f} µs ({calls[name] / args.window:,.0f} calls/s)"
                for name in trees), flush=True)  # fmt: skip
        ours, theirs = costs["this tree"], costs["other"]
        paired = statistics.median(a - b for a, b in zip(ours, theirs, strict=True))
        base = statistics.median(theirs)
        kind = ("kept-alive" if keep else "new-connection") + (" bridged" if args.triton else "")
        kind += " held (token)" if args.token else ""
        kind += f" (at {args.rate:g}/s)" if args.rate else ""
        print(f"CPU µs per {kind} call, median: this tree {statistics.median(ours):.1f}, other "
              f"{base:.1f}; paired difference {paired:+.1f} µs ({paired / base:+.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
