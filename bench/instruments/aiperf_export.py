"""Reading AIPerf's summary export (``profile_export_aiperf.json``, AIPerf 0.13) for the
benchmarks that drive it: how many requests completed, how many it cancelled (AIPerf records a
request it cancelled as an error with code 499, ``RequestCancellationError``), the other errors,
and the latency and throughput figures.

An export that lacks a figure gives 0 for a count and NaN for a latency or rate (a run with
every request cancelled has no time to first token), so a table can show it as missing."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CANCELLED_CODE = 499
EXPORT_NAME = "profile_export_aiperf.json"
RECORDS_NAME = "profile_export.jsonl"


@dataclass(frozen=True)
class AiperfRun:
    completed: int
    cancelled: int
    other_errors: int
    other_error_types: tuple[str, ...]
    ttft_ms_avg: float
    ttft_ms_p50: float
    latency_ms_avg: float
    latency_ms_max: float
    output_tokens_s: float
    requests_s: float


def find_export(directory: Path) -> Path:
    """The summary export AIPerf wrote under ``directory`` (it nests it in a folder it names)."""
    found = sorted(directory.rglob(EXPORT_NAME))
    if not found:
        raise FileNotFoundError(f"AIPerf wrote no {EXPORT_NAME} under {directory}")
    return found[0]


def _stat(export: Mapping[str, Any], metric: str, stat: str) -> float:
    record = export.get(metric)
    if not isinstance(record, Mapping) or record.get(stat) is None:
        return math.nan
    return float(record[stat])


def _count(export: Mapping[str, Any], metric: str) -> int:
    value = _stat(export, metric, "avg")
    return 0 if math.isnan(value) else int(value)


def error_counts(export: Mapping[str, Any]) -> tuple[int, int, tuple[str, ...]]:
    """(cancelled, other errors, the other errors' types) from ``error_summary``."""
    cancelled = others = 0
    types: list[str] = []
    for entry in export.get("error_summary") or ():
        details = entry.get("error_details") or {}
        count = int(entry.get("count", 0))
        if details.get("code") == CANCELLED_CODE:
            cancelled += count
        else:
            others += count
            types.append(f"{details.get('type') or details.get('code')}: {count}")
    return cancelled, others, tuple(types)


def summarize(export: Mapping[str, Any]) -> AiperfRun:
    cancelled, others, types = error_counts(export)
    return AiperfRun(
        completed=_count(export, "request_count"),
        cancelled=cancelled,
        other_errors=others,
        other_error_types=types,
        ttft_ms_avg=_stat(export, "time_to_first_token", "avg"),
        ttft_ms_p50=_stat(export, "time_to_first_token", "p50"),
        latency_ms_avg=_stat(export, "request_latency", "avg"),
        latency_ms_max=_stat(export, "request_latency", "max"),
        output_tokens_s=_stat(export, "output_token_throughput", "avg"),
        requests_s=_stat(export, "request_throughput", "avg"),
    )


def read_run(directory: Path) -> AiperfRun:
    """:func:`summarize` the export AIPerf wrote under ``directory``."""
    return summarize(json.loads(find_export(directory).read_text()))


def request_ids(directory: Path) -> dict[str, str]:
    """Per request of the run, the ``X-Request-Id`` AIPerf sent, and what became of it
    (``cancelled after 0.225 s``, ``completed``, or the error), from its per-request records."""
    found: dict[str, str] = {}
    for records in sorted(directory.rglob(RECORDS_NAME)):
        for line in records.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            rid = (record.get("metadata") or {}).get("x_request_id")
            if rid:
                error = record.get("error") or {}
                found[str(rid)] = str(error.get("message") or "completed")
    return found
