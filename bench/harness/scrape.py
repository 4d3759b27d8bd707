"""Reading Prometheus text from a ``/metrics`` endpoint the way a scraper does: every sample
keyed by its name and full label set. Ships with ``bench/``; ``tests/support/scrape.py`` adds the
tests' sums and scrapes in the background."""

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
        text = await resp.text()
        assert resp.status == 200, f"{base_url}/metrics answered {resp.status}: {text[:500]}"
        return parse(text)
