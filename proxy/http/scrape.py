"""A metrics scrape (``--scrape-paths``): relayed as a plain GET outside the call accounting."""

from __future__ import annotations

import asyncio

from proxy.errors import UpstreamError
from proxy.labels import SERVER_HEADER
from proxy.messages import Answer, Request, error_answer
from proxy.metrics import ProxyMetrics
from proxy.upstream.client import Client

# The headers that choose a scrape's format, its deadline, its size.
_SCRAPE_HEADERS = frozenset({"accept", "accept-encoding", "authorization"})
SCRAPE_TIMEOUT_S = 10.0
SCRAPE_MAX_BYTES = 16 << 20


async def scrape(request: Request, upstream_client: Client, metrics: ProxyMetrics) -> Answer:
    """A metrics scrape (``--scrape-paths``), relayed as a plain GET outside the call
    accounting: an Endpoint Picker scrapes every 50 ms, and a call for each (a log line,
    the call metrics) would bury the calls that matter. There is nothing to cancel: a
    scrape whose client leaves is dropped with its handler. The answer is read whole (at
    most ``SCRAPE_MAX_BYTES``, within ``SCRAPE_TIMEOUT_S``), as scrapers expect it."""
    headers = [(n, v) for n, v in request.headers if n.lower() in _SCRAPE_HEADERS]
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            upstream = await upstream_client.request("GET", request.raw_path, headers, None)
            try:
                body = await upstream.read(SCRAPE_MAX_BYTES)
            except BaseException:
                upstream.close()
                raise
            upstream.release()
            status = upstream.status
            content_type = next(
                (v for n, v in upstream.headers if n.lower() == "content-type"), None
            )
    except (UpstreamError, ValueError, TimeoutError) as exc:
        status = 504 if isinstance(exc, TimeoutError) else 502
        metrics.scrapes.labels(str(status)).inc()
        return error_answer(
            status, f"metrics scrape of the upstream failed: {exc or type(exc).__name__}"
        )
    metrics.scrapes.labels(str(status)).inc()
    return Answer(status, body, content_type=content_type, headers={"Server": SERVER_HEADER})
