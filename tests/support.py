"""Test helpers: real processes (see bench/processes.py) and waiting on conditions."""

from __future__ import annotations

import asyncio
import inspect
import time
import urllib.request
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from bench.processes import REPO, Process, child_env, spawn, wait_ready

__all__ = [
    "POLL_INTERVAL", "REPO", "Process", "child_env", "metric_sum", "poll_until", "spawn",
    "wait_ready", "wait_until",
]  # fmt: skip


POLL_INTERVAL = 0.005
"""How often ``wait_until`` looks again; it waits on a condition, never for a guessed time."""


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool], within: float = 10.0, what: str = ""
) -> None:
    """Poll ``predicate`` until it is true; fail after ``within`` seconds naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(POLL_INTERVAL)


def poll_until(
    predicate: Callable[[], bool], within: float, what: str, interval: float = POLL_INTERVAL
) -> None:
    """Blocking twin of :func:`wait_until` for synchronous tests and clients."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(interval)


def metric_sum(base_url: str, name: str, labels: dict[str, str]) -> float:
    """Scrape ``base_url/metrics``: the sum of ``name`` over samples that carry ``labels``."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )
