"""A peer's address, as the two processes' listeners name it.

aiohttp and the HTTP server name a peer by its address alone; gRPC names it ``ipv4:host:port``
or ``ipv6:[host]:port`` (the brackets sometimes percent-encoded), or ``unix:path``. Both sides
need the host alone: the proxy to append it to ``x-forwarded-for``, the gateway to tell clients
apart for fair shares.
"""

from __future__ import annotations


def peer_host(peer: str) -> str:
    """The host of a peer address: ``1.2.3.4`` of ``ipv4:1.2.3.4:5``, ``::1`` of
    ``ipv6:[::1]:5`` (or ``ipv6:%5B::1%5D:5``); anything else as it is (aiohttp's
    ``request.remote``, a ``unix:`` path)."""
    kind, colon, rest = peer.partition(":")
    if not colon or kind not in ("ipv4", "ipv6"):
        return peer
    if kind == "ipv6":
        rest = rest.replace("%5B", "[").replace("%5D", "]")
        if rest.startswith("["):
            return rest[1:].partition("]")[0]
    return rest.rpartition(":")[0] or rest
