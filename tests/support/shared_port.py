"""What a client sees of how several processes behind one port share new connections."""

from __future__ import annotations

import asyncio

import aiohttp

from bench.base.addresses import host_port


async def answered_one_by_one(url: str, calls: int, within: float) -> list[int | str]:
    """GET ``url`` ``calls`` times, one after another, each on a new connection: the status of
    each, or ``"held"`` for one not answered within ``within`` seconds."""
    seen: list[int | str] = []
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=within)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for _ in range(calls):
            try:
                async with session.get(url) as resp:
                    await resp.read()
                    seen.append(resp.status)
            except TimeoutError:
                seen.append("held")
    return seen


async def refused(address: str) -> bool:
    """Whether a new connection to ``host:port`` is refused (nothing listens any more); one that
    is taken is closed at once. A connect reset is a refusal too: the kernel resets a handshake
    that was still in the listener's queue when the listener closed (seen once in a loaded run
    of the workers' drain test)."""
    host, port = host_port(address)
    try:
        _, writer = await asyncio.open_connection(host, port)
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    writer.close()
    return False
