"""The headline's tables and sentence, from its results' JSON: per pair and point, each side's
median over the rounds (with the rounds' range), and hangup's side against the other as ratios of
medians."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

FIGURES = (  # (key, heading, format)
    ("goodput", "goodput tok/s", "{:,.0f}"),
    ("completed_per_min", "completed /min", "{:,.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"),
    ("latency_p50_ms", "latency p50 ms", "{:,.0f}"),
    ("latency_p99_ms", "latency p99 ms", "{:,.0f}"),
    ("nobody_tokens", "tokens for nobody", "{:,.0f}"),
    ("nobody_per_hangup", "... per hang-up", "{:,.0f}"),
)


def line(pair: Any, run: dict[str, Any]) -> str:
    """One run as it finishes, for the log."""
    return (f"{pair.name} r{run['round'] + 1} {run['side']:>10} {run['point']:>18}: "
            f"{run['completed']} completed, {run['cancelled']} hung up, {run['errors']} errors; "
            f"goodput {run['goodput']:,.0f} tok/s, latency p99 {run['latency_p99_ms']:,.0f} ms, "
            f"{run['nobody_tokens']:,.0f} tokens for nobody "
            f"(leftovers {run['leftovers_s']:.1f} s)")  # fmt: skip


def _derived(run: dict[str, Any]) -> dict[str, Any]:
    hung_up = run["cancelled"]
    return {**run, "nobody_per_hangup": run["nobody_tokens"] / hung_up if hung_up else math.nan}


def figures(runs: Iterable[dict[str, Any]], key: str) -> list[float]:
    """``key`` of each run that has a figure for it (a run may have none: NaN)."""
    return [float(r[key]) for r in runs if not math.isnan(float(r[key]))]


def median(runs: Iterable[dict[str, Any]], key: str) -> float:
    found = figures(runs, key)
    return statistics.median(found) if found else math.nan


def cell(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
    values = figures(runs, key)
    if not values:
        return "-"
    middle = fmt.format(statistics.median(values))
    if len(values) < 2:
        return middle
    return f"{middle} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def grouped(pair: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs of ``pair`` by (point, side), points in the order they ran."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in pair["runs"]:
        groups.setdefault((run["point"], run["side"]), []).append(_derived(run))
    return groups


def ratios(pair: dict[str, Any], point: str) -> tuple[float, float]:
    """(hangup's goodput over the other side's, the other's p99 latency over hangup's) at
    ``point``, from the medians."""
    groups = grouped(pair)
    other, ours = (groups.get((point, side), []) for side in pair["sides"])
    goodput = median(ours, "goodput") / median(other, "goodput")
    p99 = median(other, "latency_p99_ms") / median(ours, "latency_p99_ms")
    return goodput, p99


def said(point: str) -> str:
    """``50%-decode-answer`` as a reader says it: ``50 % in decoding``."""
    rate, lands, kind = point.split("-")
    where = "in decoding" if lands == "decode" else "at once"
    return f"{rate.rstrip('%')} % {where}" + (", streams" if kind == "stream" else "")


def table(name: str, pair: dict[str, Any]) -> str:
    heads = " | ".join(head for _, head, _ in FIGURES)
    rows = [f"**{pair['title']}** (`{name}`; hang-ups in decoding wait "
            f"{pair['delays'].get('decode', math.nan):.2f} s)", "",
            f"| hang-ups | side | {heads} |", "|---|---|" + "---:|" * len(FIGURES)]  # fmt: skip
    labels = dict(zip(pair["sides"], pair["labels"], strict=True))
    groups = grouped(pair)
    for point in dict.fromkeys(point for point, _ in groups):
        for side in pair["sides"]:
            cells = " | ".join(cell(groups[point, side], key, fmt) for key, _, fmt in FIGURES)
            rows.append(f"| {said(point)} | {labels[side]} | {cells} |")
    return "\n".join(rows)


def headline(results: dict[str, Any], point: str = "50%-decode-answer") -> list[str]:
    """A sentence per pair: what hangup's side gives the clients who stay at ``point``."""
    sentences = []
    for name, pair in results["pairs"].items():
        goodput, p99 = ratios(pair, point)
        if math.isnan(goodput):
            continue  # a run without that point (--rates)
        other, ours = pair["labels"]
        sentences.append(f"{name}, {said(point)}: {ours} gives the clients who "
                    f"stay {goodput:.2f}x the goodput of {other} and {p99:.2f}x lower p99 "
                    f"latency")  # fmt: skip
    return sentences


def tables(results: dict[str, Any]) -> str:
    parts = [f"{results['date']}, commit {results['commit']}, {results['machine']}; "
             f"{results['rounds']} rounds, medians (range)"]  # fmt: skip
    parts += [table(name, pair) for name, pair in results["pairs"].items()]
    parts += headline(results)
    return "\n\n".join(parts)
