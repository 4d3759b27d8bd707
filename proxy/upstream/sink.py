"""Where an answer's body goes as a connection of the proxy's HTTP/1.1 client
(``proxy.upstream.connection``) reads it: a :class:`Sink` (the relay's writes to its client).
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    """Where a response body goes, chunk by chunk, as it arrives."""

    def write(self, chunk: bytes) -> None:
        """Take one chunk (called from the connection's callback: must not block)."""

    def flush(self) -> None:
        """Nothing more is ready for now: write what the sink holds back (a response's head)."""

    def full(self) -> bool:
        """True when the sink can take no more for now: reading from the upstream pauses."""

    async def drain(self) -> None:
        """Return once the sink can take more; raise to end the relay."""
