"""``bench.pd.cancel``'s arithmetic and tables: the cancellation delays chosen from a probe call's
phases, and the Markdown report of its results (pure: no process, no I/O)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gateway_server.engine.vllm.kv_handoff import handoff_key

PHASES = ("queued", "prefill", "transfer", "decode")


def choose_delays(probe: Mapping[str, float], override: str = "") -> dict[str, float]:
    """AIPerf's cancellation delays, seconds after a request is sent: ``0``; ``handoff``, the
    middle of the probe's ``transfer`` (from entering it, or from its first token when no poll
    saw it, to its first token); ``late``, half-way from its first token to its end.
    ``override`` ("H,L") gives the last two instead."""
    if override:
        try:
            handoff, late = (float(x) for x in override.split(","))
        except ValueError:
            raise ValueError(
                f"--delays wants two numbers of seconds, 'H,L': {override!r}"
            ) from None
        return {"0": 0.0, "handoff": handoff, "late": late}
    first, end = probe.get("first_token", math.nan), probe.get("end", math.nan)
    if math.isnan(first) or math.isnan(end) or end < first:
        raise ValueError(f"the probe call has no first token or end: {dict(probe)}")
    entered = probe.get("transfer", first)
    return {"0": 0.0, "handoff": (entered + first) / 2, "late": (first + end) / 2}


def owners(files: set[str], requests: Mapping[str, str]) -> dict[str, str]:
    """Whose each handoff file is: the request id (and its fate) whose first engine request's
    handoff key names it (a call's engine requests are ``ID-1``, ``ID-2``...); ``?`` if none."""
    by_key = {handoff_key(f"{rid}-1"): f"{rid} ({fate})" for rid, fate in requests.items()}
    return {name: by_key.get(name.split(".", 1)[0], "?") for name in sorted(files)}


def _ms(seconds: Any) -> str:
    value = float(seconds)
    return "-" if math.isnan(value) else f"{1000 * value:.0f}"


def _freed(seconds: Any) -> str:
    value = float(seconds)
    return "NOT within 15 s" if math.isnan(value) else f"{value:.2f} s"


def _counts(counts: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in counts.items() if v) or "none"


def cancel_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| delay | AIPerf completed / cancelled (499) / other errors | gateway cancellations "
        "(queued / prefill / transfer / decode = total) | proxy cancel calls | all freed after "
        "| left |",
        "|---|---|---|---|---:|---|",
    ]
    for run in runs:
        a, by_phase = run["aiperf"], run["gateway_cancellations"]
        phases = " / ".join(f"{by_phase.get(p, 0):g}" for p in PHASES)
        freed = float(run["freed_s"])
        lines.append(
            f"| {run['label']} ({1000 * float(run['delay_s']):.0f} ms) | {a['completed']} / "
            f"{a['cancelled']} / {a['other_errors']} | {phases} = "
            f"{sum(by_phase.values()):g} | {_counts(run['proxy_cancel_calls'])} | "
            f"{_freed(freed)} | "
            f"{_counts(run['left'])} |"
        )
    for run in runs:
        for name, owner in (run.get("left_handoffs") or {}).items():
            lines.append(f"\nLeft in the handoff store after run {run['label']}: {name}, "
                         f"the handoff of {owner}.")  # fmt: skip
    return lines


def hol_table(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    freed = rows.get("after_10_freed") or [{"ttft_s": math.nan, "end_s": math.nan}] * len(
        rows["none"]
    )
    lines = [
        "| rep | idle: TTFT / end ms | after 10 cancelled prefills: TTFT / end ms | the same "
        "once the gateway freed them | phases at the hang-up | gateway cancellations | all "
        "freed after |",
        "|---:|---:|---:|---:|---|---|---:|",
    ]
    together = zip(rows["none"], rows["after_10"], freed, strict=True)
    for i, (idle, after, later) in enumerate(together):
        phases = {p: list(after["phases_at_hangup"]).count(p) for p in PHASES}
        lines.append(
            f"| {i + 1} | {_ms(idle['ttft_s'])} / {_ms(idle['end_s'])} | "
            f"{_ms(after['ttft_s'])} / {_ms(after['end_s'])} | "
            f"{_ms(later['ttft_s'])} / {_ms(later['end_s'])} | {_counts(phases)} | "
            f"{_counts(after['cancelled_by_phase'])} | {_freed(after['freed_s'])} |"
        )
    medians = [
        " / ".join(
            _ms(statistics.median(float(r[key]) for r in runs)) for key in ("ttft_s", "end_s")
        )
        for runs in (rows["none"], rows["after_10"], freed)
    ]
    lines.append(f"| median | {' | '.join(medians)} | | | |")
    return lines


def _spent(slowest: Mapping[str, float]) -> str:
    """A :func:`bench.pd.stack.slowest` as ``queued 12, prefill 40, ...`` (ms)."""
    return ", ".join(f"{p} {_ms(slowest[p])}" for p in PHASES if p in slowest) or "-"


def compare_table(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    lines = [
        "| workers | TTFT avg / p50 ms (per round) | output tokens/s | requests/s | "
        "slowest request ms | where the slowest call's time went, ms | "
        "the other gateway's CPU s meanwhile |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"pd": "`prefill,decode`", "agg": "`both,both`"}
    for name, runs in rows.items():
        a = [r["aiperf"] for r in runs]
        lines.append(
            f"| {names.get(name, name)} | "
            + " · ".join(f"{x['ttft_ms_avg']:.0f} / {x['ttft_ms_p50']:.0f}" for x in a) + " | "
            + " · ".join(f"{x['output_tokens_s']:.0f}" for x in a) + " | "
            + " · ".join(f"{x['requests_s']:.2f}" for x in a) + " | "
            + " · ".join(f"{x['latency_ms_max']:.0f}" for x in a) + " | "
            + " · ".join(_spent(r.get("slowest") or {}) for r in runs) + " | "
            + " · ".join(f"{float(r['other_cpu_s']):.1f}" for r in runs) + " |"
        )  # fmt: skip
    return lines


def report(results: Mapping[str, Any]) -> str:
    """The results as Markdown tables, one per part that ran."""
    out: list[str] = []
    if "cancel" in results:
        out += ["Cancellation under AIPerf (P/D):", "", *cancel_table(results["cancel"]["runs"])]
    if "hol" in results:
        out += ["", "Head-of-line (P/D, through the proxy):", "", *hol_table(results["hol"])]
    if "compare" in results:
        out += ["", "P/D against aggregated (AIPerf, no cancellation):", "",
                *compare_table(results["compare"])]  # fmt: skip
    timings = results.get("timings_s", {})
    out += ["", "Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())]
    return "\n".join(out) + "\n"
