"""What the chaos soak found in each phase (``chaos.py``), and the checks on it.

A ``PhaseReport`` is filled by the phase's clients as they call (``chaos_traffic.py``) and, once
they have stopped, by ``settle``, which waits for the pod to settle and then records:

- ``zombies``: calls still in flight on the gateway (every client has left or finished);
- ``mismatches``: completed calls whose text differs from the direct one;
- ``false_ends``: streams that ended cleanly without their end marker (a cut stream must never
  look complete);
- ``unaccounted``: cancel calls still pending in the proxy, and cancels given up on that were
  not both counted (``hangup_proxy_cancel_calls_total{result="gave_up"}``) and logged, in the
  proxy process now running;
- ``engines``: workers not serving, or holding KV cache or requests, once the pod settled;
- ``leftovers``: processes of a drained gateway's group still running after it exited;
- the processes' resident memory and open files.

``assert_clean_and_serving`` checks a soak's reports, ``summary`` prints one, and ``growth`` is
how much a process's memory and open files grew over the soak.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.faults import Pod
from bench.harness.log_records import stray_lines
from bench.harness.stack import in_flight

SETTLE_S = 10.0


@dataclass
class PhaseReport:
    fault: str
    what: str = ""
    seconds: float = 0.0
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    zombies: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    false_ends: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)  # workers down or not idle after settling
    leftovers: list[str] = field(default_factory=list)  # of a drained gateway's process group
    engine_restarts: float = 0.0  # the gateway process's count after the phase
    cancels: float = 0.0
    gave_up: float = 0.0
    unaccounted: float = 0.0
    resources: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (KiB, files)
    incarnations: dict[str, int] = field(default_factory=dict)  # name: which start of it
    fire_after: int = 0  # calls after which the phase's fault fires
    until: float = 0.0  # when clients stop calling (time.monotonic())
    under_way: asyncio.Event = field(default_factory=asyncio.Event)  # set at fire_after calls
    _counted: int = 0

    def count(self, label: str) -> None:
        self.calls[label] += 1
        self._counted += 1
        if self.fire_after and self._counted >= self.fire_after:
            self.under_way.set()

    @property
    def findings(self) -> list[str]:
        return (
            [f"zombie {z}" for z in self.zombies]
            + [f"mismatch {m}" for m in self.mismatches]
            + [f"false end {f}" for f in self.false_ends]
            + [f"engine {e}" for e in self.engines]
            + [f"leftover {p}" for p in self.leftovers]
            + ([f"{self.unaccounted:g} cancels pending or not counted"] if self.unaccounted else [])
        )


def assert_clean_and_serving(reports: list[PhaseReport]) -> None:
    """No phase found anything wrong, every phase completed calls (the pod served again after
    its fault) and the last phase had no failure (recovered)."""
    for report in reports:
        assert not report.findings, (report.fault, report.findings[:5])
        complete = sum(n for k, n in report.calls.items() if k.endswith("complete"))
        assert complete > 0, report
    assert not reports[-1].failures, reports[-1].failures


async def settle(pod: Pod, session: aiohttp.ClientSession, report: PhaseReport) -> None:
    """Wait (up to SETTLE_S) for the gateway to have nothing in flight and the proxy no cancel
    pending; record what is left, the proxy's cancel results and the resources."""
    assert pod.proxy is not None
    admin = pod.proxy.url("admin")
    left: dict[str, Any] = {}

    async def settled() -> bool:
        nonlocal left
        left = await in_flight(session, pod.gateway_url)
        return not left and not total(await scrape_async(session, admin), _PENDING)

    with contextlib.suppress(AssertionError):  # not settled in time: what is left is reported
        await wait_until(settled, within=SETTLE_S, what="the pod to settle")
    report.zombies = sorted(left)
    report.leftovers = pod.take_leftovers()
    samples = await scrape_async(session, admin)
    report.cancels = total(samples, "hangup_proxy_cancel_calls_total")
    report.gave_up = total(samples, "hangup_proxy_cancel_calls_total", result="gave_up")
    # Each cancel given up on is counted and logged once (warning "cancel <id> gave up ...").
    logged = pod.proxy.log().count("gave up after")
    report.unaccounted = total(samples, _PENDING) + abs(report.gave_up - logged)
    await _check_engines(pod, session, report)
    report.resources = pod.resources()
    report.incarnations = {name: pod.incarnation(name) for name in ("gateway", "proxy")}


_PENDING = "hangup_proxy_cancel_calls_pending"


async def _check_engines(pod: Pod, session: aiohttp.ClientSession, report: PhaseReport) -> None:
    """Every worker up and idle (no request, no KV cache held), within the settle time."""
    found: list[str] = []

    async def idle() -> bool:
        nonlocal found
        samples = await scrape_async(session, pod.gateway_url)
        found = [f"{name.removeprefix('hangup_gateway_')} {dict(labels)} = {value:g}"
                 for (name, labels), value in samples.items()
                 if (name == "hangup_gateway_worker_up" and value != 1)
                 or (name in _ENGINE_LOAD and value)]  # fmt: skip
        report.engine_restarts = total(samples, "hangup_gateway_engine_restarts_total")
        return not found

    with contextlib.suppress(AssertionError):
        await wait_until(idle, within=SETTLE_S, what="the engines up and idle")
    report.engines = found


_ENGINE_LOAD = ("hangup_gateway_engine_running_requests", "hangup_gateway_engine_waiting_requests",
                "hangup_gateway_engine_kv_cache_usage_ratio")  # fmt: skip


def summary(report: PhaseReport) -> str:
    calls = sum(report.calls.values())
    complete = sum(n for k, n in report.calls.items() if k.endswith("complete"))
    hung_up = sum(n for k, n in report.calls.items() if "hang-up" in k)
    rate = calls / report.seconds
    return (
        f"{report.fault:>14}: {calls} calls in {report.seconds:.0f} s ({rate:.0f}/s);"
        f" {complete} complete, {hung_up} hung up; this proxy's cancel calls {report.cancels:g}"
        f" (gave up {report.gave_up:g}); zombies {len(report.zombies)};"
        f" findings {len(report.findings)}; {report.what}; resources {report.resources}"
    )


def growth(reports: list[PhaseReport], name: str) -> tuple[int, int]:
    """The most ``name``'s memory (KiB) and open files grew within one of its processes, from
    the first settle that saw that process to the last."""
    seen: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for report in reports:
        if name in report.resources:
            seen[report.incarnations[name]].append(report.resources[name])
    rss = max((s[-1][0] - s[0][0] for s in seen.values()), default=0)
    files = max((s[-1][1] - s[0][1] for s in seen.values()), default=0)
    return rss, files


def stray_log_lines(root: Path) -> list[str]:
    """Lines of the pod's logs under ``root`` that a log pipeline would trip on
    (``log_records.stray_lines``), each named by its process."""
    return [
        f"{path.parent.name}: {line}"
        for path in sorted(root.rglob("*.log"))
        for line in stray_lines(path.read_text(errors="replace"))
    ]
