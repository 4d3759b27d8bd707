"""Benchmark: the long run of the hostile-input properties (issue 59): does every parser a client
reaches do work linear in its input, within its stated budget, and answer only its documented
client error, for inputs a derandomized test run never draws?

The parsers, their inputs, budgets and checks are ``bench/harness/hostile_parsers.py`` (``make
test`` runs each property on a few dozen derandomized examples and on the costliest inputs known,
``tests/hostile/``). Here each runs on fresh random examples, in batches of ``--batch`` until
``--examples`` (per parser; ``--examples-of http=20000`` for one) or ``--minutes`` per parser has
passed, and prints per parser: the examples run, the largest input, the worst CPU time per MiB
(over inputs of 1 MiB or more: below that the budget's floor dominates), the worst share of its
budget, and the first failure, if any (the input that broke a rule, as it was found: a timed
property is not shrunk, see ``hostile_parsers.PHASES``).
The costliest inputs known run first. The CPU time is the parsing thread's
(``time.thread_time``), so the machine's other load barely moves it.

Run: ``.venv/bin/python -m bench.robustness.hostile --examples 100000`` (about 27 minutes on the
2-core machine: the HTTP server's 100,000 in 5 min, ``/infer``'s in 12, generate's in 9, gRPC
metadata's in 1; ``--minutes`` stops a parser sooner, and the output says how many ran).
Writes ``.demo/hostile/results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from bench.harness.hostile import MIB
from bench.harness.hostile_parsers import PARSERS, PHASES, Parser, Seen

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    """What one parser's run saw."""

    parser: str
    limit: int
    budget: str
    examples: int = 0
    largest: int = 0
    worst_ms_per_mib: float = 0.0  # over inputs of 1 MiB or more
    worst_share: float = 0.0  # of the budget, over every input
    worst_input: str = ""  # the start of the input that came closest to its budget
    seconds: float = 0.0
    failure: str | None = None
    batches: list[int] = field(default_factory=list)

    def add(self, parser: Parser, seen: Seen) -> None:
        self.examples += 1
        self.largest = max(self.largest, seen.nbytes)
        share = seen.spent / parser.budget.allows(seen.nbytes)
        if share > self.worst_share:
            self.worst_share, self.worst_input = share, f"{seen.nbytes:,} bytes: {seen.what}"
        if seen.nbytes >= MIB:
            self.worst_ms_per_mib = max(
                self.worst_ms_per_mib, seen.spent * 1000 * MIB / seen.nbytes
            )


def run(parser: Parser, examples: int, minutes: float, batch: int) -> Tally:
    budget = f"{parser.budget.per_mib * 1000:g} ms/MiB + {parser.budget.floor * 1000:g} ms"
    tally = Tally(parser.name, parser.limit, budget)
    started = time.monotonic()
    try:
        for case in parser.worst():
            tally.add(parser, parser.check(case))
    except AssertionError as exc:
        tally.failure = _said(exc)
    fresh = settings(
        max_examples=batch, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck), phases=PHASES,
    )  # fmt: skip

    @fresh
    @given(parser.inputs)
    def prop(case: Any) -> None:
        tally.add(parser, parser.check(case))

    while tally.failure is None and tally.examples < examples:
        if time.monotonic() - started > minutes * 60:
            break
        before = tally.examples
        try:
            prop()
        except Exception as exc:  # a rule broken (the example as found: no shrinking)
            tally.failure = _said(exc)
        tally.batches.append(tally.examples - before)
    tally.seconds = round(time.monotonic() - started, 1)
    return tally


def _said(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_said(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _counts(args: argparse.Namespace) -> dict[str, int]:
    counts = dict.fromkeys(args.parsers.split(","), args.examples)
    for item in args.examples_of:
        name, _, count = item.partition("=")
        counts[name] = int(count)
    unknown = set(counts) - set(PARSERS)
    if unknown:
        raise SystemExit(f"no parser {sorted(unknown)}; there are {sorted(PARSERS)}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100_000, help="per parser")
    parser.add_argument("--examples-of", action="append", default=[], metavar="PARSER=N",
                        help="another count for one parser")  # fmt: skip
    parser.add_argument("--parsers", default=",".join(PARSERS), help="comma-separated")
    parser.add_argument("--minutes", type=float, default=60.0, help="per parser, at most")
    parser.add_argument("--batch", type=int, default=1000, help="examples per Hypothesis run")
    parser.add_argument("--out", type=Path, default=REPO / ".demo" / "hostile")
    args = parser.parse_args()
    tallies = []
    for name, count in _counts(args).items():
        tally = run(PARSERS[name], count, args.minutes, args.batch)
        tallies.append(tally)
        verdict = "nothing found" if tally.failure is None else f"FOUND {tally.failure}"
        print(f"{name}: {tally.examples} examples in {tally.seconds:.0f} s (largest "
              f"{tally.largest / MIB:.2f} MiB), worst {tally.worst_ms_per_mib:.1f} ms per MiB "
              f"(budget {tally.budget}), worst {tally.worst_share:.2f} of the budget "
              f"({tally.worst_input}); {verdict}", flush=True)  # fmt: skip
    print("\n| parser | limit | budget | worst seen | examples |\n|---|---|---|---|---|")
    for t in tallies:
        print(f"| `{t.parser}` | {t.limit / MIB:g} MiB | {t.budget} | {t.worst_ms_per_mib:.1f} "
              f"ms/MiB ({t.worst_share:.2f} of the budget) | {t.examples:,} |")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"at": time.strftime("%Y-%m-%d"), "tallies": [asdict(t) for t in tallies]}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
