"""Reading Prometheus text from a ``/metrics`` endpoint the way a scraper does: every sample
keyed by its name and full label set, summed over the labels a test names."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

# re-exported from the harness the demos ship with: the tests' one place
from bench.harness.scrape import Samples as Samples
from bench.harness.scrape import metrics_text as metrics_text
from bench.harness.scrape import parse as parse
from bench.harness.scrape import scrape as scrape
from bench.harness.scrape import scrape_async as scrape_async


@dataclass
class Scrapes:
    """What :func:`scraping` saw."""

    answered: int = 0  # 200 with exposition text a scraper parses
    failed: list[str] = field(default_factory=list)  # any other answer, and why
    cut: int = 0  # connections closed with no answer (given to a process as it was killed)


@contextlib.asynccontextmanager
async def scraping(session: aiohttp.ClientSession, *urls: str) -> AsyncIterator[Scrapes]:
    """Scrape ``urls`` in turn, back to back, while the block runs, as Prometheus and the
    Endpoint Picker would; the loop stops when the block ends, however it ends."""
    seen = Scrapes()

    async def scrape(url: str) -> None:
        try:
            async with session.get(url) as resp:
                text = await resp.text()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            seen.cut += 1
            return
        try:
            if resp.status != 200:
                raise ValueError(f"status {resp.status}: {text[:300]}")
            parse(text)
        except ValueError as exc:
            seen.failed.append(f"{url}: {exc}")
        else:
            seen.answered += 1

    async def loop() -> None:
        while True:
            for url in urls:
                await scrape(url)

    task = asyncio.get_running_loop().create_task(loop())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every sample whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    """How much ``name`` (summed over ``labels``) grew between two scrapes."""
    return total(after, name, **labels) - total(before, name, **labels)


def metric_sum(base_url: str, name: str, **labels: str) -> float:
    """Scrape ``base_url/metrics`` once: the sum of ``name`` over samples that carry ``labels``."""
    return total(scrape(base_url), name, **labels)
