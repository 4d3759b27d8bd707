"""Benchmark: client -> hangup's proxy -> Triton -> vLLM. Does a client's hang-up free the engine?

vLLM's ``AsyncLLM`` runs inside a real Triton 2.51.0 (``bench/harness/triton/vllm.py``: a
python-backend model written like Triton's vLLM backend, on the tiny local model with the vLLM
tier's engine options, that aborts a request in the engine once Triton says it was cancelled and
records how each request ended), with hangup's Triton bridge in front (``--cancel-adapter
triton``). Hang-ups, per stage, direct to Triton's HTTP frontend and through the bridge:

- ``stream``: ``generate_stream``, closed after the third event (decoding);
- ``answer``: ``generate`` (one answer), closed after 0.3 s (decoding, nothing sent yet);
- ``prefill``: ``generate_stream`` with a ~7,400-token prompt, closed after 0.2 s (in prefill);
- ``burst``: sixteen ``generate_stream`` calls at once, each closed after its second event
  (``--max-num-seqs 8``: eight decode, eight wait in vLLM's queue).

Per row: the hang-ups that aborted the request in vLLM, the time from the hang-up to
``AsyncLLM.abort`` returning (p50/p99, ms), the tokens each request generated (p50/max: a
hang-up never seen costs all ``--tokens``), and whether the engine core then reported nothing
running, waiting or held in its KV cache. Run with nothing else on the machine; the direct
``answer`` and ``prefill`` rows each cost ``--tokens`` tokens per call.

Run: ``.venv/bin/python -m bench.triton.with_vllm`` (``--calls 5`` for a quick look; needs
``.venv-triton`` and vLLM, which ``make test`` installs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from bench.base.processes import REPO, spawn
from bench.harness.triton.io import hang_up_http
from bench.harness.triton.server import TritonServer
from bench.harness.triton.vllm import MODEL, body, ended, engine, engine_idle, triton_with_vllm
from bench.harness.vllm_stack import LONG_PROMPT, make_tiny_model
from bench.instruments.stats import median_p99

# (base URL, tag, tokens) -> [(prompt, when it hung up)]
Hangup = Callable[[str, str, int], Awaitable[list[tuple[str, float]]]]


def one(route: str, prompt: str, events: int | None, after_s: float) -> Hangup:
    async def hang_up(base: str, tag: str, tokens: int) -> list[tuple[str, float]]:
        key = f"{prompt}{tag}-{time.monotonic_ns()}"
        stream = route == "generate_stream"
        url = f"{base}/v2/models/{MODEL}/{route}"
        return [(key, await hang_up_http(url, body(key, stream, tokens), events, after_s))]

    return hang_up


async def burst(base: str, tag: str, tokens: int) -> list[tuple[str, float]]:
    keys = [f"{tag}-{i}-{time.monotonic_ns()}" for i in range(16)]
    url = f"{base}/v2/models/{MODEL}/generate_stream"
    gone = await asyncio.gather(*(hang_up_http(url, body(k, True, tokens), 2, 60.0) for k in keys))
    return list(zip(keys, gone, strict=True))


STAGES: dict[str, Hangup] = {
    "stream": one("generate_stream", "", 3, 60.0),
    "answer": one("generate", "", None, 0.3),
    "prefill": one("generate_stream", LONG_PROMPT, None, 0.2),
    "burst": burst,
}


async def run_row(server: TritonServer, base: str, stage: str, calls: int, tokens: int) -> str:
    aborted_ms: list[float] = []
    made: list[int] = []
    rounds = max(1, calls // 16) if stage == "burst" else calls
    for i in range(rounds):
        for key, gone in await STAGES[stage](base, f"{stage}{i}", tokens):
            end = await ended(server, key, wait_s=120)
            made.append(int(end["tokens"]))
            if end["how"] == "cancelled":
                aborted_ms.append(1000 * (end["aborted"] - gone))
        await engine_idle(server, wait_s=120)  # each round starts on an idle engine
    stats = engine(server)
    idle = (
        "yes"
        if (stats["running"], stats["waiting"], stats["kv_cache_usage"]) == (0, 0, 0)
        else "NO"
    )
    seen = median_p99(aborted_ms, 1) if aborted_ms else "never"
    tokens_made = f"{statistics.median(made):.0f}/{max(made)}"
    return f"{len(aborted_ms):>5}/{len(made):<5} {seen:>17} {tokens_made:>15} {idle:>5}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="hang-ups per row")
    parser.add_argument("--tokens", type=int, default=400, help="max_tokens per request")
    parser.add_argument("--stages", default=",".join(STAGES))
    args = parser.parse_args()
    work = REPO / ".demo" / f"bench-triton-vllm-{time.time_ns()}"
    model = make_tiny_model(work / "tiny")
    with triton_with_vllm(work / "triton", model) as server:
        bridge_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                       "--upstream-http", server.url(), "--upstream-grpc", server.grpc,
                       "--cancel-adapter", "triton"]  # fmt: skip
        with spawn("proxy", bridge_args, work / "bridge") as bridge:
            targets = {"direct": server.url(), "bridge": bridge.url()}
            print(f"{'stage':>8} {'target':>7} {'aborted/calls':>13} {'abort ms p50/p99':>17}"
                  f" {'tokens p50/max':>15} {'idle':>5}")  # fmt: skip
            for stage in args.stages.split(","):
                for target, base in targets.items():
                    row = await run_row(server, base, stage, args.calls, args.tokens)
                    print(f"{stage:>8} {target:>7} {row}", flush=True)
            bridge.terminate()


if __name__ == "__main__":
    asyncio.run(main())
