"""Reading Prometheus text from a ``/metrics`` endpoint the way a scraper does: every sample
keyed by its name and full label set, summed over the labels a test names."""

from __future__ import annotations

import urllib.request

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
        return parse(await resp.text())


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
