"""Benchmark: what a streamed token costs the gateway over gRPC (``ModelStreamInfer``) against
an OpenAI SSE event, and against grpcio's own floor, in one run (issues 51 and 65), with a reader
that keeps up and with one that falls behind.

Rows, alternating each round, each measured over the same ``--window`` of the host's monotonic
clock after ``--warmup`` seconds of load:

- **gateway gRPC**: ``--streams`` concurrent ``ModelStreamInfer`` calls straight to the gateway
  (no proxy), one after another: each sends one request (``stream`` true, ``max_tokens``
  ``--tokens``, ``ignore_eos``), half-closes and reads every response (one per token while it
  keeps up, the last one flagged ``triton_final_response``) until the end of the call;
- **gateway gRPC, slow reader**: the same calls read by a client that falls behind: before each
  read it sleeps ``--read-pause`` seconds, and its receive window is small (HTTP/2 lookahead of
  1 KiB, no BDP probing: a client on a slow link), so the gateway's writer waits for it and a
  request's tokens pile up unwritten (DESIGN.md's "Streams that fall behind": merged, several to
  a response);
- **gateway SSE**: as many streaming ``/v1/completions`` of the same token count on the same
  gateway process, each loop on one kept-alive connection (``bench.scaling.load``); a completion
  of N tokens is N + 1 events (the last is ``data: [DONE]``);
- **floor, message objects** and **floor, prebuilt bytes**: a bare ``grpc.aio`` server with no
  hangup code answering each request with ``--tokens`` responses of the gateway's shape
  (``bench.grpc.floor``'s ``aio`` and ``aio-bytes`` servers), driven by the same load as the
  gateway's gRPC row;
- **floor, paced**: a bare ``grpc.aio`` server writing the same prebuilt bytes, but each stream
  one response per tick of one timer every ``--sim-step`` seconds, as the simulated engine
  hands every running request a token per step: the floor at the gateway's pace, where fewer
  responses share each wakeup of grpcio's poller and of the event loop;
- with ``--other DIR`` (a checkout of another tree, e.g. ``git archive`` of a commit unpacked
  there; more than once for more trees): **gRPC of DIR** and **gRPC of DIR, slow reader**, that
  tree's gateway loaded as this one's gRPC rows, for a paired before/after (an identical tree
  there shows the noise).

What each number includes: **µs per response** is the serving process's own CPU time (user and
system, from ``/proc``) over the window divided by the responses (gRPC messages, or SSE events)
its clients received in the window. For the gateway that is everything the one process does:
the simulated engine (``--sim-step`` seconds per step, 1024 slots, no per-sequence cost: the
same settings for both of its rows), the call's bookkeeping and metrics, and the protocol; the
engine's share per token is the same on both rows, but the SSE row spreads a call's own work
over one more event. **µs per token** divides by tokens instead (SSE: events less one per
call; gRPC: counted by the client in the responses' text, a word a token as the simulated engine
writes them). The loads run in processes of their own (one
for gRPC, one channel; one for SSE), not counted. No CPU quota unless ``--core`` gives every
measured server that share of a core (root, a writable cgroup: :mod:`bench.instruments.cgroups`).

Prints a JSON line per row and round, then a table of medians with the ratios the issue names
(gRPC to SSE per token; gRPC to the floor per response). Run:
``.venv/bin/python -m bench.grpc.stream_cost`` (about 3 minutes). The gRPC load runs as this
module with ``--role load``.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.base.processes import REPO, child_env, stop_group, wait_ready
from bench.grpc.floor import SERVICE, STREAM, stream_response
from bench.grpc.floor import server_process as floor_server
from bench.grpc.paths import text_request
from bench.instruments.cgroups import Controller, CpuGroup, cpu_controller
from bench.instruments.stats import cpu_of, print_json_line
from bench.scaling.relays import SIM
from hangup_contract.protos import inference_pb2 as pb


@dataclass
class Row:
    name: str
    kind: str  # "grpc" or "sse"
    target: str  # host:port
    pids: list[int]
    gateway: bool  # a gateway row: also µs per token
    read_pause: float = 0.0  # a slow reader's sleep before each read (0: it keeps up)


SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
"""The slow reader's channel: a receive window of 1 KiB, not grown by BDP probing."""
SLOW = "{}, slow reader"


def _tokens(raw: bytes) -> int:
    """Tokens in one response of the gateway's: words of its text (the simulated engine's)."""
    response = pb.ModelStreamInferResponse.FromString(raw).infer_response
    contents = response.raw_output_contents
    return len(contents[0][4:].split()) if contents else 0


# --- the gRPC load (its own process) ----------------------------------------------------------


def _load(args: argparse.Namespace) -> None:
    """``--streams`` loops of one call after another; prints the responses (and with
    ``--count-tokens`` the tokens) counted in the window and this process's CPU seconds in it."""

    async def run() -> None:
        body = text_request("b", "bench", args.tokens, True).SerializeToString()
        counted, tokens = [0], [0]
        counting = [False]
        options = SMALL_WINDOW if args.read_pause else None
        async with grpc.aio.insecure_channel(args.target, options=options) as channel:
            stream = channel.stream_stream(STREAM)  # raw bytes both ways

            async def loop() -> None:
                while time.monotonic() < args.end:
                    call = stream()
                    await call.write(body)
                    await call.done_writing()
                    while True:
                        if args.read_pause:
                            await asyncio.sleep(args.read_pause)
                        raw = await call.read()
                        if raw is grpc.aio.EOF:
                            break
                        counted[0] += counting[0]
                        if args.count_tokens and counting[0]:
                            tokens[0] += _tokens(raw)

            tasks = [asyncio.ensure_future(loop()) for _ in range(args.streams)]
            await asyncio.sleep(max(0.0, args.start - time.monotonic()))
            counting[0], cpu0 = True, time.process_time()
            await asyncio.sleep(max(0.0, args.end - time.monotonic()))
            counting[0], cpu = False, time.process_time() - cpu0
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        print_json_line({"events": counted[0], "tokens": tokens[0], "cpu": cpu})

    uvloop.run(run())


# --- the servers ------------------------------------------------------------------------------


def _paced_floor(args: argparse.Namespace) -> None:
    """The paced floor server: prints its port, then serves until terminated."""

    async def serve() -> None:
        prebuilt = stream_response(0).SerializeToString()
        tick = asyncio.Event()  # a waiter of its own per stream: a cancelled stream cancels its own

        async def ticker() -> None:
            while True:
                await asyncio.sleep(args.sim_step)
                tick.set()  # wakes every stream waiting now
                tick.clear()

        async def stream(requests: Any, context: Any) -> None:
            async for _ in requests:
                for _index in range(args.tokens):
                    await tick.wait()
                    await context.write(prebuilt)

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream)}
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        timer = asyncio.create_task(ticker())
        print(port, flush=True)
        await server.wait_for_termination()
        timer.cancel()

    uvloop.run(serve())


@contextlib.contextmanager
def _paced_floor_server(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    argv = [sys.executable, "-m", "bench.grpc.stream_cost", "--role", "paced-floor",
            "--tokens", str(args.tokens), "--sim-step", str(args.sim_step)]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert process.stdout is not None
        yield f"127.0.0.1:{int(process.stdout.readline())}", process.pid
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def _gateway(
    tree: Path, work: Path, args: argparse.Namespace
) -> Iterator[tuple[dict[str, str], int]]:
    """The gateway of the checkout at ``tree`` (one process, the simulated engine); yields its
    listeners and pid."""
    work.mkdir(parents=True, exist_ok=True)
    ready, log = work / "ready.json", work / "gateway.log"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "gateway_server", *SIM, "--sim-step-base", str(args.sim_step),
            "--http-port", "0", "--grpc-port", "0", "--ready-file", str(ready)]  # fmt: skip
    env = child_env({"PYTHONPATH": str(tree)})
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tree, process_group=0
        )
    try:
        yield wait_ready(popen, ready, log, 60.0), popen.pid
    finally:
        stop_group(popen)


def _limit(
    stack: contextlib.ExitStack, controller: Controller | None, pid: int, core: float
) -> None:
    if controller is None:
        return
    group = CpuGroup(controller, f"hangup-stream-cost-{os.getpid()}-{pid}", core, weight=4)
    stack.callback(group.remove)
    group.add(pid)


# --- one window -------------------------------------------------------------------------------


def _window(row: Row, args: argparse.Namespace) -> dict[str, float]:
    start = time.monotonic() + args.warmup
    end = start + args.window
    if row.kind == "grpc":
        argv = [sys.executable, "-m", "bench.grpc.stream_cost", "--role", "load",
                "--target", row.target, "--streams", str(args.streams),
                "--tokens", str(args.tokens), "--read-pause", str(row.read_pause)]  # fmt: skip
        argv += ["--count-tokens"] if row.gateway else []
    else:
        argv = [sys.executable, "-m", "bench.scaling.load", "--address", row.target, "--kind",
                "completions", "--keep-alive", "--concurrency", str(args.streams),
                "--events", str(args.tokens)]  # fmt: skip
    argv += ["--start", f"{start:.6f}", "--end", f"{end:.6f}"]
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    time.sleep(max(0.0, start - time.monotonic()))
    before = cpu_of(row.pids)
    time.sleep(max(0.0, end - time.monotonic()))
    cpu = cpu_of(row.pids) - before
    out, _ = client.communicate(timeout=args.window + 60)
    got = json.loads(out.strip().splitlines()[-1])
    events = max(1, int(got["events"]))
    result = {
        "per_s": events / args.window,
        "us_per_response": cpu / events * 1e6,
        "cores": cpu / args.window,
        "load_cores": float(got["cpu"]) / args.window,
    }
    if row.gateway:
        # An SSE call of N tokens is N + 1 events; a gRPC response carries the tokens counted.
        if row.kind == "sse":
            tokens = events * args.tokens / (args.tokens + 1)
        else:
            tokens = max(1, int(got["tokens"]))
            result["tokens_per_response"] = tokens / events
        result["us_per_token"] = cpu / tokens * 1e6
        result["tokens_per_s"] = tokens / args.window
    return result


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    controller = cpu_controller() if args.core else None
    if controller is not None:
        print(controller.describe(), flush=True)
    work = REPO / ".demo" / "bench-grpc-stream-cost" / str(time.monotonic_ns())
    rows: list[Row] = []
    results: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        listeners, pid = stack.enter_context(_gateway(REPO, work / "this", args))
        _limit(stack, controller, pid, args.core)
        rows += [Row("gateway gRPC", "grpc", listeners["grpc"], [pid], True),
                 Row(SLOW.format("gateway gRPC"), "grpc", listeners["grpc"], [pid], True,
                     args.read_pause),
                 Row("gateway SSE", "sse", listeners["http"], [pid], True)]  # fmt: skip
        for index, tree in enumerate(args.other):
            other, other_pid = stack.enter_context(_gateway(tree, work / f"other-{index}", args))
            _limit(stack, controller, other_pid, args.core)
            name = f"gRPC of {tree}"
            rows += [Row(name, "grpc", other["grpc"], [other_pid], True),
                     Row(SLOW.format(name), "grpc", other["grpc"], [other_pid], True,
                         args.read_pause)]  # fmt: skip
        for way, name in (
            ("aio", "floor, message objects"),
            ("aio-bytes", "floor, prebuilt bytes"),
        ):
            target, floor_pid = stack.enter_context(floor_server(way, args.tokens))
            _limit(stack, controller, floor_pid, args.core)
            rows.append(Row(name, "grpc", target, [floor_pid], False))
        target, floor_pid = stack.enter_context(_paced_floor_server(args))
        _limit(stack, controller, floor_pid, args.core)
        rows.append(Row("floor, paced", "grpc", target, [floor_pid], False))
        for round_ in range(args.rounds):
            for row in rows:
                result = _window(row, args)
                results.setdefault(row.name, []).append(result)
                rounded = {k: round(v, 2) for k, v in result.items()}
                print(json.dumps({"round": round_ + 1, "row": row.name, **rounded}), flush=True)
    return results


def report(results: dict[str, list[dict[str, float]]]) -> str:
    def mid(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def cell(name: str, key: str) -> str:
        values = [r[key] for r in results[name] if key in r]
        if not values:
            return ""
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    lines = ["| row | responses a second | tokens a second | tokens a response "
             "| µs per response | µs per token | cores busy | load's cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in results:
        per_s = f"{mid(name, 'per_s'):,.0f}"
        counted = (("tokens_per_s", ",.0f"), ("tokens_per_response", ".2f"))
        tokens = [f"{mid(name, k):{form}}" if k in results[name][0] else ""
                  for k, form in counted]  # fmt: skip
        cells = [cell(name, k) for k in ("us_per_response", "us_per_token")]
        lines.append(f"| {name} | {per_s} | {' | '.join(tokens)} | {' | '.join(cells)} | "
                     f"{mid(name, 'cores'):.2f} | {mid(name, 'load_cores'):.2f} |")  # fmt: skip
    grpc_token = mid("gateway gRPC", "us_per_token")
    slow_token = mid(SLOW.format("gateway gRPC"), "us_per_token")
    sse_token = mid("gateway SSE", "us_per_token")
    lines.append("")
    lines.append(f"gateway gRPC / SSE per token: {grpc_token / sse_token:.2f}x")
    lines.append(f"gateway gRPC, slow reader / SSE per token: {slow_token / sse_token:.2f}x")
    lines.append(
        f"gateway gRPC, slow reader / keeping up, per token: {slow_token / grpc_token:.2f}x"
    )
    for floor in ("floor, message objects", "floor, prebuilt bytes", "floor, paced"):
        ratio = mid("gateway gRPC", "us_per_response") / mid(floor, "us_per_response")
        lines.append(f"gateway gRPC / {floor} per response: {ratio:.2f}x")
    for name in results:
        if name.startswith("gRPC of "):
            slow = name.endswith(SLOW.format(""))
            ours = SLOW.format("gateway gRPC") if slow else "gateway gRPC"
            ratio = mid(ours, "us_per_token") / mid(name, "us_per_token")
            lines.append(f"{ours} / {name}, per token: {ratio:.2f}x")
    return "\n".join(lines)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--role", choices=("run", "load", "paced-floor"), default="run")
    parser.add_argument("--target", default="")
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--end", type=float, default=0.0)
    parser.add_argument("--streams", type=int, default=64, help="calls in flight")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per call")
    parser.add_argument("--sim-step", type=float, default=0.001, help="the engine's step, s")
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--read-pause", type=float, default=0.02, help="the slow reader's sleep before a read, s"
    )
    parser.add_argument("--count-tokens", action="store_true", help="(the load's) count tokens")
    parser.add_argument("--core", type=float, default=0.0, help="a CPU quota per server (root)")
    parser.add_argument(
        "--other", type=Path, action="append", default=[], help="another checkout's gateway (a row)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.role == "load":
        _load(args)
        return
    if args.role == "paced-floor":
        _paced_floor(args)
        return
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(report(results))


if __name__ == "__main__":
    main()
