"""Diagnosis: does a gateway API process go silent under the vLLM tier's load, and if so, where
is it while it is?

Once, in a full ``make test``, one of two API processes answered nothing for about 7.8 s at the
start of ``tests/vllm/test_vllm_api_processes.py``'s 40 calls (one proxy worker's calls ended
504 on the 5 s connect timeout). This reproduces that test's conditions and watches every
process involved, so that a silence, if it comes, is caught in the act:

- the tier's shared gateway (two vLLM workers) and the test's own: ``--workers 2
  --api-processes 2`` (two more), the proxy with two workers in front; four vLLM engine workers
  that spin on this machine's two cores; ``--busy N`` adds N busy-looping processes beside
  them (CI's machine is that loaded);
- rounds of the test's 40 calls through the proxy (16 hang up after 5 events, 16 are cancelled
  straight on the gateway after their first, 8 run to the end), each call timed;
- every 50 ms, for each API process and proxy worker: its main thread's CPU time and its time
  runnable but waiting for a CPU (``/proc/PID/task/PID/schedstat``), and the accept queues of
  the gateway's listeners (``ss -ltn``);
- a call that has waited ``--silence`` seconds for its first byte triggers a dump: ``py-spy
  dump`` of both API processes (when py-spy is installed: ``.venv/bin/pip install py-spy``),
  ``ss``, and the samples around it; the gateways run ``--loop-stall-limit`` 0.5 s, so a blocked
  loop logs its stack too.

What it prints per round: calls, 504s, slowest first event, and for each process the largest
share of a 0.5 s window it spent waiting for a CPU. A silence explained by starvation shows a
wait share near 1 for the silent process; a blocked loop shows CPU time without progress, or a
stack in the dump.

Run: ``.venv/bin/python -m bench.diagnosis.api_silence --rounds 30 --busy 1`` (about 15 s a round
after a two-minute start; ``--cold``: each round on a gateway and proxy just started, as the test's
module starts them, about a minute a round). Diagnostics go to ``--out`` (default
``.demo/api-silence``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.addresses import port_of
from bench.base.processes import Process, children, spawn
from bench.harness.vllm_stack import IGNORE_EOS, MODEL, make_tiny_model, vllm_gateway

TOKENS = 120
LONG = 4000
SAMPLE_S = 0.05
WINDOW_S = 0.5


@dataclass
class Call:
    rid: str
    fate: str
    started: float
    first: float | None = None
    status: int | None = None
    error: str | None = None


@dataclass
class Watch:
    """Samples of each watched process: (t, cpu_ns, wait_ns) of its main thread."""

    pids: dict[str, int]
    samples: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)
    queues: list[tuple[float, str]] = field(default_factory=list)

    def sample(self, port: int) -> None:
        now = time.monotonic()
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError, ValueError):
                cpu, wait, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
                self.samples.setdefault(name, []).append((now, int(cpu), int(wait)))
        listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                                 text=True, check=False).stdout  # fmt: skip
        self.queues.append((now, " | ".join(" ".join(line.split()[:3]) for line in
                                            listing.splitlines())))  # fmt: skip

    def worst_wait(self, since: float) -> dict[str, float]:
        """For each process: the largest share of a WINDOW_S window (after ``since``) that its
        main thread spent runnable, waiting for a CPU."""
        worst: dict[str, float] = {}
        for name, rows in self.samples.items():
            rows = [r for r in rows if r[0] >= since]
            share = 0.0
            j = 0
            for i in range(len(rows)):
                while rows[i][0] - rows[j][0] > WINDOW_S:
                    j += 1
                span = rows[i][0] - rows[j][0]
                if span >= WINDOW_S * 0.8:
                    share = max(share, (rows[i][2] - rows[j][2]) / 1e9 / span)
            worst[name] = round(share, 2)
        return worst

    def around(self, start: float, end: float) -> dict[str, Any]:
        rows = {n: [(round(t - start, 3), c, w) for t, c, w in r if start - 1 <= t <= end]
                for n, r in self.samples.items()}  # fmt: skip
        return {"schedstat": rows,
                "accept_queues": [(round(t - start, 3), q) for t, q in self.queues
                                  if start - 1 <= t <= end]}  # fmt: skip


async def _events(resp: aiohttp.ClientResponse, call: Call, stop_after: int | None) -> int:
    seen = 0
    async for line in resp.content:
        if call.first is None:
            call.first = time.monotonic()
        if line.startswith(b"data: "):
            seen += 1
            if stop_after is not None and seen == stop_after:
                break
    return seen


async def _call(session: aiohttp.ClientSession, proxy: str, gateway: str, call: Call) -> None:
    tokens = TOKENS if call.fate == "complete" else LONG
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": tokens, "stream": True,
            **IGNORE_EOS}  # fmt: skip
    try:
        async with session.post(proxy + "/v1/completions", json=body,
                                headers={"X-Request-Id": call.rid}) as resp:  # fmt: skip
            call.status = resp.status
            if resp.status != 200:
                call.first = time.monotonic()
                call.error = (await resp.text())[:200]
                return
            if call.fate == "hang_up":
                await _events(resp, call, 5)
                resp.close()  # the client leaves mid-stream (leaving the block would not)
                return
            if call.fate == "cancel":
                await _events(resp, call, 1)
                fresh = aiohttp.TCPConnector(force_close=True)
                async with (
                    aiohttp.ClientSession(connector=fresh) as other,
                    other.post(f"{gateway}/v2/requests/{call.rid}/cancel") as cancelled,
                ):
                    await cancelled.read()
            await _events(resp, call, None)
    except aiohttp.ClientError as exc:
        call.error = repr(exc)


def _dump(out: Path, name: str, api: dict[str, int], watch: Watch, start: float) -> None:
    """What every process is doing now, into ``out/name``."""
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    for label, pid in api.items():
        if Path(spy).exists():
            dumped = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True,
                                    text=True, check=False, timeout=30)  # fmt: skip
            (target / f"{label}.py-spy.txt").write_text(dumped.stdout + dumped.stderr)
        status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
        (target / f"{label}.status.txt").write_text(status)
    ss = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, check=False).stdout
    (target / "ss.txt").write_text(ss)
    (target / "samples.json").write_text(json.dumps(watch.around(start, time.monotonic())))


async def _round(index: int, session: aiohttp.ClientSession, gateway: Process, proxy: Process,
                 watch: Watch, api: dict[str, int],
                 args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    fates = ["hang_up"] * 16 + ["cancel"] * 16 + ["complete"] * 8
    start = time.monotonic()
    calls = [Call(f"r{index}-{i}", fate, start) for i, fate in enumerate(fates)]
    port = port_of(gateway.listeners["http"])
    tasks = [asyncio.ensure_future(_call(session, proxy.url(), gateway.url(), c)) for c in calls]
    dumped = False
    while not all(t.done() for t in tasks):
        await asyncio.sleep(SAMPLE_S)
        watch.sample(port)
        now = time.monotonic()
        waiting = [c for c in calls if c.first is None and now - c.started > args.silence]
        if waiting and not dumped:
            dumped = True
            await asyncio.to_thread(_dump, args.out, f"round-{index}", api, watch, start)
    await asyncio.gather(*tasks)
    firsts = [c.first - c.started for c in calls if c.first is not None]
    return {
        "round": index,
        "calls": len(calls),
        "504": sum(c.status == 504 for c in calls),
        "errors": [c.error for c in calls if c.error][:3],
        "slowest_first_s": round(max(firsts), 2) if firsts else None,
        "slow": [
            (c.rid, c.fate, round(c.first - c.started, 2))
            for c in calls
            if c.first is not None and c.first - c.started > 1.0
        ][:5],
        "dumped": dumped,
        "worst_cpu_wait_share": watch.worst_wait(start),
    }


async def _warm_up(gateway: str) -> None:
    body = {"model": MODEL, "prompt": "warm up", "max_tokens": 16}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for _ in range(8):
            async with session.post(gateway + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()


async def _idle(gateway: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(2400):
            async with session.get(gateway + "/v2/requests") as resp:
                if not (await resp.json())["requests"]:
                    return
            await asyncio.sleep(0.05)
    raise TimeoutError("calls still in flight two minutes after a round")


async def _rounds(gateway: Process, proxy: Process, args: argparse.Namespace,
                  first: int, count: int) -> None:  # fmt: skip
    await _warm_up(gateway.url())
    api = {f"api{i}": pid for i, pid in enumerate(sorted(children(gateway.popen.pid)))}
    workers = {f"proxy{i}": pid for i, pid in enumerate(sorted(children(proxy.popen.pid)))}
    watch = Watch({**api, **workers})
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for index in range(first, first + count):
            result = await _round(index, session, gateway, proxy, watch, api, args)
            print(json.dumps(result), flush=True)
            await _idle(gateway.url())
    stalls = [line for line in gateway.log().splitlines() if "event_loop_stalled" in line]
    print(json.dumps({"event_loop_stalled": len(stalls)}), flush=True)
    for line in stalls:
        print(line, flush=True)


@contextlib.contextmanager
def _scaled(model: Path, tmp: Path, out: Path) -> Iterator[tuple[Process, Process]]:
    """The test module's gateway (two API processes, one vLLM worker each) and proxy; their
    logs are kept in ``out``."""
    stall = ["--loop-stall-limit", "0.5"]
    with (
        vllm_gateway(model, tmp / "scaled", workers=2, api_processes=2, extra=stall) as gateway,
        spawn("proxy", ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                        "--upstream-http", gateway.url(), "--trust-client-request-id",
                        "--workers", "2"], tmp / "proxy") as proxy,
    ):  # fmt: skip
        try:
            yield gateway, proxy
        finally:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(gateway.log_path, out / "gateway.log")
            shutil.copy(proxy.log_path, out / "proxy.log")


@contextlib.contextmanager
def _busy(count: int) -> Iterator[None]:
    """``count`` busy-looping processes in this session (as CI's machine is loaded)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside (default 1)")
    parser.add_argument("--silence", type=float, default=2.0,
                        help="seconds without a first byte that trigger a dump")  # fmt: skip
    parser.add_argument("--no-shared", action="store_true",
                        help="without the tier's shared two-worker gateway")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(".demo/api-silence"))
    parser.add_argument("--cold", action="store_true",
                        help="each round on a gateway and proxy just started")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="api-silence-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = make_tiny_model(tmp / "model")
        with contextlib.ExitStack() as stack:
            if not args.no_shared:
                stack.enter_context(vllm_gateway(model, tmp / "shared", workers=2))
            stack.enter_context(_busy(args.busy))
            if not args.cold:
                with _scaled(model, tmp, args.out) as (gateway, proxy):
                    asyncio.run(_rounds(gateway, proxy, args, 0, args.rounds))
                return
            for index in range(args.rounds):  # each round on a gateway just started
                with _scaled(model, tmp / f"round-{index}", args.out / f"round-{index}") as (
                    gateway,
                    proxy,
                ):
                    asyncio.run(_rounds(gateway, proxy, args, index, 1))


if __name__ == "__main__":
    main()
