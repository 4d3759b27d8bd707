"""An admission queue that serves clients in turn, and each client's calls in turn.

A waiting item is filed under its :class:`~.base.Share`: its client, then its call. :meth:`pop`
takes the oldest item of the first call of the first client in the rotation, then moves that
call to the back of its client's calls and that client to the back of the clients (dropping
either once it has nothing left). So a client waits for at most one item of each other client
that has work waiting, and a call for at most one item of each other call of its client,
however many items those hold: one call's thousands of requests cannot delay another call's
first (docs/security.md, "Fair shares"). A client or call that appears joins at the back.

Every operation is O(1) (dicts keep insertion order; a rotation is a delete and a re-insert),
so a queue of 20,000 items admits, and drops a cancelled item, as cheaply as one of ten.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from gateway_server.engine.base import Share

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        # client → call → key → item; every level in rotation order.
        self._clients: dict[str, dict[str, dict[str, T]]] = {}
        self._len = 0

    def push(self, share: Share, key: str, item: T) -> None:
        """File ``item`` under ``share`` by ``key`` (unique among the queue's items)."""
        calls = self._clients.setdefault(share.client, {})
        calls.setdefault(share.call, {})[key] = item
        self._len += 1

    def pop(self) -> T:
        """The next item in turn (see the module doc). Raises IndexError when empty."""
        if not self._clients:
            raise IndexError("pop from an empty FairQueue")
        client = next(iter(self._clients))
        calls = self._clients.pop(client)
        call = next(iter(calls))
        items = calls.pop(call)
        item = items.pop(next(iter(items)))
        self._len -= 1
        if items:
            calls[call] = items  # the call's next item waits for the other calls' turns
        if calls:
            self._clients[client] = calls
        return item

    def remove(self, share: Share, key: str) -> T | None:
        """Take ``key``'s item out of turn (a cancel); None when it is not waiting here."""
        calls = self._clients.get(share.client)
        if calls is None:
            return None
        items = calls.get(share.call)
        if items is None or key not in items:
            return None
        item = items.pop(key)
        self._len -= 1
        if not items:
            del calls[share.call]
            if not calls:
                del self._clients[share.client]
        return item

    def clear(self) -> None:
        self._clients.clear()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiting item (in no promised order)."""
        for calls in self._clients.values():
            for items in calls.values():
                yield from items.values()
