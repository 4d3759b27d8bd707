"""Benchmark: cancellation under AIPerf against a disaggregated (P/D) gateway on real vLLM (CPU,
tiny local model, ``--worker-roles prefill,decode``: one prefill and one decode worker, the KV
handed over by hangup's connector), with ``hangup-proxy`` in front; and P/D against aggregated
serving on the same two workers.

Parts (``--parts``, all by default):

- ``cancel``: AIPerf streams completions through the proxy, one at a time by default
  (``--cancel-concurrency``: so that a delay lands where the probe saw the phases), and cancels
  ``--cancel-rate`` percent of them (it hangs up) at three delays after each request is sent:
  ``0``; ``handoff``, the middle of a lone probe call's ``transfer`` phase (end of prefill → its
  first token); ``late``, half-way through the probe's decode. Per run: AIPerf's cancelled
  count (its 499 errors) against the gateway's ``hangup_gateway_cancellations_total`` delta per
  phase and the proxy's cancel calls by result; then how long until nothing is left (no call in
  ``GET /v2/requests``, both workers without running or waiting requests and with an empty KV
  cache, ``hangup_gateway_handoff_kv_blocks`` and ``hangup_gateway_handoffs_in_flight`` 0, the
  handoff store's directory empty).
- ``hol``: Dynamo's head-of-line test (``bench.pd.hol``): a short call's time to first token and
  to its end on the idle gateway, right after ten ~7,400-token prompts were hung up while
  queued or in prefill, and after ten more once the gateway had freed them (what the cancels
  cost, apart), ``--hol-reps`` times each, in turn.
- ``compare``: a second gateway with ``--worker-roles both,both`` (aggregated) beside the P/D
  one; AIPerf without cancellation against each in turn, ``--compare-rounds`` rounds, the order
  swapped every round: time to first token and output tokens/s, the slowest request, and where
  the slowest call's time went phase by phase (the gateway's ``GET /v2/requests`` polled every
  20 ms during each run: a small load on the gateway measured). Both gateways' engines share the
  machine's cores, so this says what P/D costs here (the prompt's KV written to and read from
  a file, a prefill leg, a decode worker that prefills what was not handed over), not what it
  gains on GPUs (prefill and decode on devices of their own, not slowing each other).

AIPerf is not a dependency of hangup: install it in ``.venv-aiperf`` (see the Makefile's
``AIPERF_VENV``) or pass ``--aiperf``. Run:
``.venv/bin/python -m bench.pd.cancel --out .demo/pd-cancel`` (about 6 minutes on two shared
cores; ``--parts cancel,hol``, about 2.5, and ``--parts compare``, about 4, split it). Results:
tables on stdout, and ``results.json``, ``results.md``, AIPerf's artifacts and the servers' logs
under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp

from bench.base.processes import REPO, descendants
from bench.base.scrape import scrape_async
from bench.harness.vllm_stack import make_tiny_model
from bench.instruments.aiperf_export import request_ids
from bench.instruments.stats import cpu_of
from bench.pd.hol import PROBE_PROMPT, head_of_line, probe
from bench.pd.report import choose_delays, owners, report
from bench.pd.stack import (
    Stack,
    aiperf,
    cancel_calls,
    cancellations,
    client,
    dump,
    pd_stack,
    phase_trace,
    reasons,
    slowest,
    wait_freed,
)

PARTS = ("cancel", "hol", "compare")


async def cancel_runs(args: argparse.Namespace, session: aiohttp.ClientSession,
                      stack: Stack) -> dict[str, object]:  # fmt: skip
    # Two probe calls, alone: the first warms the engines up, the second is measured.
    probes = [await probe(session, stack, f"probe-{i}", PROBE_PROMPT, args.output_tokens)
              for i in range(2)]  # fmt: skip
    delays = choose_delays(probes[-1], args.delays)
    runs = []
    for label, delay in delays.items():
        gateway0 = await scrape_async(session, stack.gateway_url)
        proxy0 = await scrape_async(session, stack.proxy_admin)
        files0 = stack.store_files()
        out = args.out / f"aiperf-cancel-{label}"
        run = await asyncio.to_thread(
            aiperf, args, stack.url, out, requests=args.requests,
            concurrency=args.cancel_concurrency, cancel_delay=delay,
        )  # fmt: skip
        freed_s, left = await wait_freed(session, stack, files0)
        gateway1 = await scrape_async(session, stack.gateway_url)
        proxy1 = await scrape_async(session, stack.proxy_admin)
        runs.append({
            "label": label, "delay_s": delay, "aiperf": run.__dict__,
            "gateway_cancellations": cancellations(gateway1, gateway0),
            "reasons": reasons(gateway1, gateway0),
            "proxy_cancel_calls": cancel_calls(proxy1, proxy0),
            "freed_s": freed_s, "left": {k: v for k, v in left.items() if v},
            "left_handoffs": owners(stack.store_files() - files0, request_ids(out)),
        })  # fmt: skip
        print(f"cancel run {label}: {runs[-1]}", flush=True)
    return {"probes": probes, "runs": runs}


def _tree(stack: Stack) -> list[int]:
    pid = stack.gateway.popen.pid
    return [pid, *descendants(pid)]


async def compare(args: argparse.Namespace, session: aiohttp.ClientSession,
                  stacks: list[Stack]) -> dict[str, list[dict[str, object]]]:  # fmt: skip
    """AIPerf without cancellation against each stack in turn; while one runs, the other's
    CPU is read (it should be idle)."""
    rows: dict[str, list[dict[str, object]]] = {s.name: [] for s in stacks}
    for r in range(args.compare_rounds):
        for stack in stacks if r % 2 == 0 else stacks[::-1]:
            others = [p for s in stacks if s is not stack for p in _tree(s)]
            cpu0 = cpu_of(others)
            out = args.out / f"aiperf-compare-{stack.name}-{r}"
            async with phase_trace(session, stack.gateway_url) as seen:
                run = await asyncio.to_thread(
                    aiperf, args, stack.url, out, requests=args.compare_requests,
                    concurrency=args.concurrency, warmup=args.concurrency,
                )  # fmt: skip
            idle_cpu = cpu_of(others) - cpu0
            _, left = await wait_freed(session, stack)
            rows[stack.name].append({"round": r, "aiperf": run.__dict__, "other_cpu_s": idle_cpu,
                                     "slowest": slowest(seen),
                                     "left": {k: v for k, v in left.items() if v}})  # fmt: skip
            print(f"compare round {r + 1} {stack.name}: {rows[stack.name][-1]}", flush=True)
    return rows


async def run_parts(args: argparse.Namespace, parts: list[str]) -> dict[str, object]:
    results: dict[str, object] = {"options": {k: str(v) for k, v in vars(args).items()}}
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stacks:
        t0 = time.monotonic()
        pd = stacks.enter_context(pd_stack("pd", "prefill,decode", args.model, args.out))
        timings["start_pd"] = time.monotonic() - t0
        async with client() as session:
            if "cancel" in parts:
                t0 = time.monotonic()
                results["cancel"] = await cancel_runs(args, session, pd)
                timings["cancel"] = time.monotonic() - t0
            if "hol" in parts:
                t0 = time.monotonic()
                results["hol"] = await head_of_line(session, pd, args.hol_reps)
                timings["hol"] = time.monotonic() - t0
            if "compare" in parts:
                t0 = time.monotonic()
                agg = stacks.enter_context(pd_stack("agg", "both,both", args.model, args.out))
                timings["start_agg"] = time.monotonic() - t0
                t0 = time.monotonic()
                results["compare"] = await compare(args, session, [pd, agg])
                timings["compare"] = time.monotonic() - t0
    results["timings_s"] = timings
    return results


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--aiperf", type=Path, default=REPO / ".venv-aiperf" / "bin" / "aiperf")
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    parser.add_argument("--requests", type=int, default=40, help="per cancellation run")
    parser.add_argument("--cancel-concurrency", type=int, default=1,
                        help="AIPerf's concurrency in the cancellation runs")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=4, help="in the P/D-aggregated runs")
    parser.add_argument("--input-tokens", type=int, default=460)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--cancel-rate", type=float, default=50.0, help="percent")
    parser.add_argument("--delays", default="", help="handoff,late in seconds (default: probed)")
    parser.add_argument("--hol-reps", type=int, default=5)
    parser.add_argument("--compare-rounds", type=int, default=3)
    parser.add_argument("--compare-requests", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=300.0, help="per AIPerf run, seconds")
    return parser.parse_args()


async def main() -> None:
    args = _arguments()
    parts = [p for p in args.parts.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        raise SystemExit(f"unknown parts {sorted(unknown)}: choose from {', '.join(PARTS)}")
    if not args.aiperf.exists():
        raise SystemExit(f"no aiperf at {args.aiperf}: install it (Makefile AIPERF_VENV) or "
                         "pass --aiperf")  # fmt: skip
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.model = args.out / "tiny"
    if not (args.model / "config.json").exists():
        make_tiny_model(args.model)
    results = await run_parts(args, parts)
    dump(args.out / "results.json", results)
    text = report(results)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
