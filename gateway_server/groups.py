"""The calls in flight by group (a job: ``hangup_contract.jobs``), and the groups cancelled lately.

A call tagged with a group joins it when it opens (``CallRegistry.open``) and leaves it when it
closes; a group cancel (``CallRegistry.cancel_group``) finds every call of its group here, then
buries the group: a call of it that opens within the tombstone ttl is refused as cancelled
before it arrived (a job's call still on its way when the job was cancelled).

Bounded, per API process: at most ``--max-groups`` groups held at once, at most
``--max-group-calls`` calls in one (429 naming the flag beyond: nothing is held then); a group
keeps the id rule (128 characters), so its bytes follow from its count. The buried groups are a
memory of ids like the registry's tombstones (``--tombstones-max``, ``--tombstones-max-bytes``,
``--tombstone-ttl``; expiring on a timer of their own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway_server.errors import CancelledBeforeArrival, TooManyRequests
from hangup_contract.cancel_labels import Reason

C = TypeVar("C")


class Memory(Protocol):
    """Where buried groups are remembered (``registry.Remembered``: bounded, expiring)."""

    def get(self, key: str) -> Reason | None: ...

    def put(self, key: str, value: Reason) -> None: ...

    @property
    def bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class GroupBounds:
    """What the groups held in one process may be (``--max-groups``, ``--max-group-calls``)."""

    groups: int = 4096
    calls: int = 4096


GROUP_BOUNDS = GroupBounds()
"""The defaults."""


class Groups(Generic[C]):
    """Group → the calls of it in flight here, by call id; and the groups buried."""

    def __init__(self, bounds: GroupBounds, buried: Memory) -> None:
        self._bounds = bounds
        self._live: dict[str, dict[str, C]] = {}
        self.buried = buried

    def join(self, group: str, call_id: str, call: C) -> None:
        """Hold ``call`` under ``group``. Raises CancelledBeforeArrival when the group was
        cancelled within the ttl, TooManyRequests past a bound."""
        reason = self.buried.get(group)
        if reason is not None:
            raise CancelledBeforeArrival(call_id, reason)
        calls = self._live.get(group)
        if calls is None:
            if len(self._live) >= self._bounds.groups:
                raise TooManyRequests(
                    f"{len(self._live)} groups are in flight, the most (--max-groups)"
                )
            calls = self._live[group] = {}
        elif len(calls) >= self._bounds.calls:
            raise TooManyRequests(
                f"group {group!r} holds {len(calls)} calls, the most (--max-group-calls)"
            )
        calls[call_id] = call

    def leave(self, group: str, call_id: str) -> None:
        calls = self._live.get(group)
        if calls is not None and calls.pop(call_id, None) is not None and not calls:
            del self._live[group]

    def calls(self, group: str) -> list[C]:
        """The calls of ``group`` in flight here."""
        return list(self._live.get(group, {}).values())

    def bury(self, group: str, reason: Reason) -> None:
        """Refuse the group's calls that open within the ttl (a group cancel was made)."""
        self.buried.put(group, reason)

    def __len__(self) -> int:
        return len(self._live)


def describe_filter(group: str | None) -> Callable[[dict[str, object]], bool]:
    """What ``GET /v2/requests?group=`` keeps of a listing's entries (all, without a group)."""
    if group is None:
        return lambda entry: True
    return lambda entry: entry.get("group") == group
