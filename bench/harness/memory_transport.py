"""A connection's transport in memory, for driving the proxy's ``HttpConnection`` with no socket:
what the server writes is kept, reading is paused and resumed as the server asks, and the peer
reads as ``127.0.0.1``. ``hostile_parsers`` runs its HTTP inputs through one.
"""

from __future__ import annotations

import asyncio
from typing import Any


class MemoryTransport(asyncio.Transport):
    """A connection's transport in memory: what is written kept, reading paused and resumed as
    the server asks."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.paused = False
        self.eof = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.eof:
            self.written += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 65536)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default
