"""One AIPerf run of the headline: the command that drives the real AIPerf with hang-ups, and
what the run gave the clients who stayed, read from AIPerf's per-request records.

A point of the sweep is a cancellation rate, where the hang-up lands (``decode``: half-way
through a request's usual time at rate 0; ``queue``: right after the request is sent) and
whether the call streams. AIPerf's own timing (``--request-cancellation-delay``): the timer starts
once the request is fully sent, and it closes the connection when it fires.

What a run gave is computed over the requests that completed, the only ones a client used:
goodput (their output tokens over the run's duration), their time to first token and latency
(p50, p99), completed requests a minute. A request AIPerf cancelled counts for nothing here; what
it cost the engine is the engine's own count of tokens generated, which the caller reads."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"


@dataclass(frozen=True)
class Load:
    """What AIPerf sends in every run (the same on both sides of a pair)."""

    concurrency: int
    requests: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Point:
    rate: int  # percent of requests AIPerf hangs up on
    lands: str  # "decode" or "queue"
    streaming: bool

    @property
    def key(self) -> str:
        return f"{self.rate}%-{self.lands}-{'stream' if self.streaming else 'answer'}"


@dataclass(frozen=True)
class Api:
    """How AIPerf speaks to a side: OpenAI chat, or Triton's HTTP ``generate`` (its ``template``
    endpoint type, the body written from ``template``)."""

    kind: str  # "chat" or "triton"
    model: str
    route: str = ""  # the template endpoint's path

    def arguments(self, load: Load, streaming: bool, work: Path) -> list[str]:
        if self.kind == "chat":
            return [
                "--endpoint-type", "chat", *(["--streaming"] if streaming else []),
                "--extra-inputs", f"max_tokens:{load.output_tokens}",
                "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
                "--use-server-token-count",
            ]  # fmt: skip
        route = self.route + ("_stream" if streaming else "")
        sampling = json.dumps({"max_tokens": load.output_tokens, "ignore_eos": True,
                               "temperature": 0})  # fmt: skip
        body = (f'{{"text_input": {{{{ text|tojson }}}}, "stream": {json.dumps(streaming)}, '
                f'"sampling_parameters": {json.dumps(sampling)}}}')  # fmt: skip
        template = work / "generate.json.j2"
        template.parent.mkdir(parents=True, exist_ok=True)
        template.write_text(body)
        return ["--endpoint-type", "template", "--custom-endpoint", route,
                "--extra-inputs", f"payload_template:{template}",
                "--extra-inputs", "response_field:text_output"]  # fmt: skip


def command(aiperf: Path, url: str, api: Api, load: Load, point: Point, delay_s: float,
            tokenizer: Path, out: Path) -> list[str]:  # fmt: skip
    """The AIPerf command for one run of ``point`` against ``url``."""
    argv = [
        str(aiperf), "profile", "--model", api.model, "--url", url,
        *api.arguments(load, point.streaming, out),
        "--tokenizer", str(tokenizer), "--concurrency", str(load.concurrency),
        "--request-count", str(load.requests),
        "--prompt-input-tokens-mean", str(load.input_tokens), "--prompt-input-tokens-stddev", "0",
        "--no-server-metrics", "--no-gpu-telemetry", "--ui", "none",
        "--output-artifact-dir", str(out), "--random-seed", "1",
    ]  # fmt: skip
    if point.rate:
        argv += ["--request-cancellation-rate", str(point.rate),
                 "--request-cancellation-delay", f"{delay_s:.3f}"]  # fmt: skip
    return argv


@dataclass(frozen=True)
class Served:
    """What one run gave the clients who stayed (``math.nan`` where nothing completed)."""

    completed: int
    cancelled: int
    errors: int
    duration_s: float
    delivered_tokens: int  # output tokens of the completed requests
    goodput: float  # delivered_tokens / duration_s
    completed_per_min: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default),
    NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _value(metrics: dict[str, Any], name: str) -> float | None:
    entry = metrics.get(name)
    return float(entry["value"]) if isinstance(entry, dict) and "value" in entry else None


def served(records: list[dict[str, Any]], duration_s: float, output_tokens: int) -> Served:
    """What the completed requests among AIPerf's per-request ``records`` got. A completed
    request's tokens are the server's usage count where it gave one, else ``output_tokens``
    (every request asks ``ignore_eos``, so it gets exactly that many)."""
    done = [r for r in records if not r.get("error") and not r["metadata"].get("was_cancelled")]
    cancelled = sum(1 for r in records if r["metadata"].get("was_cancelled"))
    delivered = 0
    latencies: list[float] = []
    ttfts: list[float] = []
    for record in done:
        metrics = record.get("metrics") or {}
        usage = _value(metrics, "usage_completion_tokens")
        delivered += int(usage) if usage is not None else output_tokens
        if (latency := _value(metrics, "request_latency")) is not None:
            latencies.append(latency)
        if (ttft := _value(metrics, "time_to_first_token")) is not None:
            ttfts.append(ttft)
    errors = len(records) - len(done) - cancelled
    return Served(
        completed=len(done), cancelled=cancelled, errors=errors, duration_s=duration_s,
        delivered_tokens=delivered, goodput=delivered / duration_s,
        completed_per_min=60 * len(done) / duration_s,
        ttft_p50_ms=quantile(ttfts, 0.5), ttft_p99_ms=quantile(ttfts, 0.99),
        latency_p50_ms=quantile(latencies, 0.5), latency_p99_ms=quantile(latencies, 0.99),
    )  # fmt: skip


def read(out: Path, output_tokens: int) -> Served:
    """:func:`served` from the records AIPerf wrote under ``out``, over the run's duration (its
    ``benchmark_duration``)."""
    summary = json.loads(next(out.rglob(SUMMARY)).read_text())
    duration = float(summary["benchmark_duration"]["avg"])
    records = [json.loads(line) for path in out.rglob(RECORDS)
               for line in path.read_text().splitlines() if line.strip()]  # fmt: skip
    return served(records, duration, output_tokens)
