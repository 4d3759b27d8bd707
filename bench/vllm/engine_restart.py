"""Benchmark: a vLLM engine core is killed; how soon does the gateway serve again by itself?

One gateway, ``--engine vllm --workers 1`` on the tiny local model with the vLLM tier's engine
options (CPU unless a GPU is there). Each round: a streamed completion runs; the engine core
named by the latest ``vllm_worker_ready`` log line gets SIGKILL; then

- **stream ended**: kill → the stream's end (it must end with an error event, no ``[DONE]``);
- **ready again**: kill → the first ``/v2/health/ready`` 200 (polled every 20 ms);
- **served**: kill → a 4-token completion answered 200;
- **gateway restart_s**: the gateway's own measure (engine seen dead → new engine ready, from
  its ``engine_worker_restarted`` log line).

Each round checks that the restart was counted (``hangup_gateway_engine_restarts_total``), that
nothing is left in flight and that the worker's gauges read idle. p50 and max over the rounds.

Run: ``.venv/bin/python -m bench.vllm.engine_restart --kills 20``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.processes import Process
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import MODEL, calls_in_flight, make_tiny_model, vllm_gateway

POLL_S = 0.02


@dataclass
class Round:
    stream_end_s: float
    ready_s: float
    served_s: float
    gateway_restart_s: float


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    return urllib.request.urlopen(request, timeout=120)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.HTTPError, OSError):
        return False


def idle(url: str) -> bool:
    samples = scrape(url)
    gauges = ("running_requests", "waiting_requests", "kv_cache_usage_ratio")
    return not any(total(samples, f"hangup_gateway_engine_{g}") for g in gauges)


def log_records(gateway: Process, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gateway.log().splitlines() if f'"{event}"' in line]


def one_round(gateway: Process, number: int) -> Round:
    url = gateway.url()
    pids = log_records(gateway, "vllm_worker_ready")[-1]["engine_core_pids"]
    body = {"model": MODEL, "prompt": "North south", "max_tokens": 4000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with post(url + "/v1/completions", body) as stream:
        while not stream.readline().startswith(b"data: "):
            pass
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        rest = [line for line in stream if line.startswith(b"data: ")]
    stream_end = time.monotonic() - killed
    assert rest and b'"error"' in rest[-1] and b"[DONE]" not in rest[-1], rest[-1:]
    poll_until(lambda: ready(url), 600, "ready again", interval=POLL_S)
    ready_s = time.monotonic() - killed
    with post(url + "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 4}) as r:
        assert r.status == 200
        r.read()
    served = time.monotonic() - killed
    samples = scrape(url)
    assert total(samples, "hangup_gateway_engine_restarts_total", worker="0") == number
    poll_until(lambda: not calls_in_flight(gateway), 30, "nothing in flight")
    poll_until(lambda: idle(url), 30, "the worker's gauges idle")
    restart_s = float(log_records(gateway, "engine_worker_restarted")[-1]["restart_s"])
    return Round(stream_end, ready_s, served, restart_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--model", type=Path, help="a model directory (default: a tiny one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="engine-restart-") as tmp:
        model = args.model or make_tiny_model(Path(tmp) / "tiny")
        with vllm_gateway(model, Path(tmp) / "gateway", workers=1) as gateway:
            rounds = []
            for number in range(1, args.kills + 1):
                rounds.append(one_round(gateway, number))
                last = rounds[-1]
                print(f"kill {number:2d}: stream ended {last.stream_end_s:.2f} s, ready again "
                      f"{last.ready_s:.2f} s, served {last.served_s:.2f} s (gateway restart_s "
                      f"{last.gateway_restart_s:.2f})", flush=True)  # fmt: skip
    print(f"\n{len(rounds)} kills, p50 / max in seconds:")
    for name in ("stream_end_s", "ready_s", "served_s", "gateway_restart_s"):
        values = [getattr(r, name) for r in rounds]
        print(f"  {name:18s} {statistics.median(values):6.2f} / {max(values):6.2f}")


if __name__ == "__main__":
    main()
