"""Reading Prometheus text from a ``/metrics`` endpoint the way a scraper does: every sample
keyed by its name and full label set, summed over the labels a caller names; and scraping in
the background while a block runs, as Prometheus would. Ships with ``bench/`` (the image's
demos use it)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics_text(base_url: str) -> str:
    """``GET base_url/metrics`` (blocking)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def scrape(base_url: str) -> Samples:
    """Every sample ``base_url/metrics`` exports now (blocking)."""
    return parse(metrics_text(base_url))


async def scrape_async(session: aiohttp.ClientSession, base_url: str) -> Samples:
    async with session.get(base_url + "/metrics") as resp:
        text = await resp.text()
        assert resp.status == 200, f"{base_url}/metrics answered {resp.status}: {text[:500]}"
        return parse(text)


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
