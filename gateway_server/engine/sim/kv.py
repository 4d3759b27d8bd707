"""The simulated engine's KV connector: prompts' KV kept by prefill engines for decode engines.

A :class:`SimKvStore` is shared by every simulated engine of a gateway (as a file connector's
directory is shared by vLLM's engines): it maps a key (an engine request's id) to the
:class:`SavedKv` of the engine that holds that prompt's KV. A prefill engine saves a prompt's
blocks in its ``SavedKv`` once prefill ends; they count in its KV-cache use until one of:

- a decode engine pulls them (:meth:`SimKvStore.pull`): freed, unless the prefill engine's
  ``lose_notification`` fault is on (it is never told; the blocks stay until release or lease);
- the gateway releases them (:meth:`SavedKv.release`, idempotent);
- their lease expires (checked whenever the holder is read: no timer), or the engine dies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    tokens: int
    blocks: int
    expires_at: float


class SavedKv:
    """One engine's KV kept for handoffs, by key."""

    def __init__(
        self, store: SimKvStore, block_size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._block_size = block_size
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self.keep_on_pull = False
        """The ``lose_notification`` fault: a pull does not free the blocks here."""

    def save(self, key: str, tokens: int, lease_s: float) -> tuple[int, float]:
        """Keep ``tokens`` of KV under ``key`` for ``lease_s``; returns (blocks, expiry)."""
        entry = _Entry(tokens, math.ceil(tokens / self._block_size), self._clock() + lease_s)
        self._entries[key] = entry
        self._store.put(key, self)
        return entry.blocks, entry.expires_at

    def hand_over(self, key: str) -> bool:
        """A decode engine loads ``key``'s KV: True when it was here (then freed, unless the
        notification is lost), False when it is gone (released, expired)."""
        self.expire()
        if key not in self._entries:
            return False
        if not self.keep_on_pull:
            self.release(key)
        return True

    def release(self, key: str) -> int:
        """Free ``key``'s KV; the blocks freed (0 when none were held). Idempotent."""
        entry = self._entries.pop(key, None)
        self._store.forget(key, self)
        return entry.blocks if entry is not None else 0

    def expire(self, *, now: float | None = None) -> None:
        """Free every entry whose lease has run out (all of them with ``now=inf``)."""
        now = self._clock() if now is None else now
        for key in [k for k, e in self._entries.items() if e.expires_at <= now]:
            self.release(key)

    def clear(self) -> None:
        for key in list(self._entries):
            self.release(key)

    def tokens(self) -> int:
        self.expire()
        return sum(e.tokens for e in self._entries.values())

    def blocks(self) -> int:
        self.expire()
        return sum(e.blocks for e in self._entries.values())

    def held(self, key: str) -> int:
        """Blocks held under ``key`` (0: none)."""
        entry = self._entries.get(key)
        return entry.blocks if entry is not None else 0


class SimKvStore:
    """Which engine holds each key's KV (see the module docstring)."""

    def __init__(self) -> None:
        self._holders: dict[str, SavedKv] = {}

    def put(self, key: str, holder: SavedKv) -> None:
        self._holders[key] = holder

    def forget(self, key: str, holder: SavedKv) -> None:
        if self._holders.get(key) is holder:
            del self._holders[key]

    def pull(self, key: str) -> bool:
        """Load ``key``'s KV from whichever engine holds it; False when none does."""
        holder = self._holders.get(key)
        return holder is not None and holder.hand_over(key)

    def __len__(self) -> int:
        return len(self._holders)
