"""Benchmark: the framing battery and the long run of the proxy server's byte-level fuzz (issue 48).

The battery (``bench/harness/framing_battery.py``; ``make test`` runs it as
``tests/multi_process/test_framing_battery.py``): 121 raw requests through hangup's proxy, Envoy
and a naive relay to upstreams that log every byte, and straight at the gateway and the proxy's
admin listener; 24 broken upstream answers through the proxy and Envoy. Prints every finding,
each target's verdict per case, and the table of differences between the proxy and Envoy that
docs/proxy.md keeps (Markdown). The fuzz (``bench/harness/server_fuzz.py``; ``make test`` runs
300 derandomized examples of each property) runs ``--fuzz-examples`` fresh random examples of
each and prints the first input that breaks a rule, if any.

Run: ``.venv/bin/python -m bench.robustness.framing`` (about 40 s; ``--fuzz-examples 20000``: about
5 min). Writes ``.demo/framing/results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.framing_battery import differences_table
from bench.harness.framing_stack import Seen, run_battery
from bench.harness.server_fuzz import check_built, check_mutated, messages, mutated


def report(seen: Seen) -> dict[str, object]:
    for kind, results in (("requests", seen.requests), ("responses", seen.responses)):
        for target, rows in results.items():
            found = [(r.name, r.findings) for r in rows if r.findings]
            print(f"{kind} through {target}: {len(rows)} cases, {len(found)} with findings")
            for name, findings in found:
                print(f"  {name}: {findings}")
    table = differences_table(seen.requests, seen.responses)
    print("\n| case | hangup | Envoy | hangup is | why |\n|---|---|---|---|---|")
    for name, ours, envoys, kind, why in table:
        print(f"| `{name}` | {ours} | {envoys} | {kind} | {why} |")
    return {
        kind: {t: {r.name: {"verdict": r.verdict, "findings": r.findings} for r in rows}
               for t, rows in results.items()}
        for kind, results in (("requests", seen.requests), ("responses", seen.responses))
    }  # fmt: skip


def fuzz(examples: int) -> list[str]:
    """Each property on ``examples`` fresh inputs; the first failure of each, as text."""
    failures: list[str] = []
    run = settings(max_examples=examples, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))  # fmt: skip

    @run
    @given(messages, st.lists(st.integers(0, 2000), max_size=6))
    def built(parts: list[bytes], at: list[int]) -> None:
        check_built(parts, at)

    @run
    @given(st.data())
    def mutations(draw: st.DataObject) -> None:
        raw = draw.draw(mutated(b"".join(draw.draw(messages))))
        check_mutated(raw, draw.draw(st.lists(st.integers(0, len(raw)), max_size=6)))

    for prop in (built, mutations):
        started = time.monotonic()
        try:
            prop()
            print(f"fuzz {prop.__name__}: {examples} examples, nothing found "
                  f"({time.monotonic() - started:.0f} s)")  # fmt: skip
        except AssertionError as exc:
            failures.append(f"{prop.__name__}: {exc}")
            print(f"fuzz {prop.__name__}: FOUND {exc}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz-examples", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path(".demo/framing"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangup-framing-") as tmp:
        seen = asyncio.run(run_battery(Path(tmp)))
    results = report(seen)
    results["fuzz"] = {"examples": args.fuzz_examples, "failures": fuzz(args.fuzz_examples)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
