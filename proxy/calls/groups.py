"""The calls this worker holds by group (a job: ``hangup_contract.jobs``), and the groups
cancelled lately: what a group cancel on the proxy's cancel API finds.

A held call whose client tagged it (``X-Hangup-Group``, gRPC ``x-hangup-group``) joins its group
when it is held (``HeldCalls.hold``) and leaves it when it ends. A group cancel ends every call
of the group here and buries the group: a call of it that arrives within ``--tombstone-ttl`` is
refused as cancelled before it arrived (499, gRPC ``CANCELLED``), as a cancel that beat its call.

Bounded, per worker: at most ``--max-groups`` groups held, at most ``--max-group-calls`` calls
in one (429, gRPC ``RESOURCE_EXHAUSTED``, beyond: nothing is held then); a group keeps the id
rule (128 characters, ``ID_COST`` more counted), so its bytes follow from the count. The buried
groups are bounded as the tombstones are (``--tombstones-max``, ``--tombstones-max-bytes``), and
forgotten ``--tombstone-ttl`` after their cancel on the held calls' timer, or the oldest first.
No I/O here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hangup_contract import jobs
from proxy.errors import BadGroup, CancelledById, TooManyGroupCalls

H = TypeVar("H", bound=Hashable)
GROUP_COST = 200
"""Bytes a group costs beyond its characters (as an id in the held table: ``held.ID_COST``)."""


@dataclass(frozen=True, slots=True)
class GroupBounds:
    """What one worker holds of groups (``--max-groups``, ``--max-group-calls``), and of groups
    cancelled (the tombstones' bounds and ttl)."""

    groups: int = 4096
    calls: int = 4096
    buried: int = 65536
    buried_bytes: int = 16 << 20
    ttl: float = 60.0


class HeldGroups(Generic[H]):
    """Group → the calls of it held here (in the order they came); the groups buried."""

    def __init__(self, bounds: GroupBounds) -> None:
        self._bounds = bounds
        self._live: dict[str, dict[H, None]] = {}
        self._buried: OrderedDict[str, float] = OrderedDict()  # group → when it is forgotten
        self.buried_bytes = 0

    def join(self, group: str, held: H, now: float) -> None:
        """Hold ``held`` under ``group``. Raises ``CancelledById`` for a group cancelled within
        the ttl, ``TooManyGroupCalls`` past a bound."""
        until = self._buried.get(group)
        if until is not None and until > now:
            raise CancelledById(f"group {group} was cancelled before this call arrived")
        calls = self._live.get(group)
        if calls is None:
            if len(self._live) >= self._bounds.groups:
                raise TooManyGroupCalls(f"{len(self._live)} groups are held (--max-groups)")
            calls = self._live[group] = {}
        elif len(calls) >= self._bounds.calls:
            raise TooManyGroupCalls(
                f"group {group!r} holds {len(calls)} calls here (--max-group-calls)"
            )
        calls[held] = None

    def leave(self, group: str, held: H) -> None:
        calls = self._live.get(group)
        if calls is not None and held in calls:
            del calls[held]
            if not calls:
                del self._live[group]

    def calls(self, group: str) -> list[H]:
        return list(self._live.get(group, ()))

    def bury(self, group: str, now: float) -> None:
        """Refuse the group's calls that arrive within the ttl."""
        if self._buried.pop(group, None) is None:
            self.buried_bytes += len(group) + GROUP_COST
        self._buried[group] = now + self._bounds.ttl
        bounds = self._bounds
        while len(self._buried) > bounds.buried or self.buried_bytes > bounds.buried_bytes:
            self._forget()

    def expire(self, now: float) -> None:
        """Forget the groups buried past their ttl (one ttl for all: oldest first)."""
        while self._buried and next(iter(self._buried.values())) <= now:
            self._forget()

    def _forget(self) -> None:
        group, _ = self._buried.popitem(last=False)
        self.buried_bytes -= len(group) + GROUP_COST

    def sizes(self) -> tuple[int, int, int]:
        """Groups held, groups buried, and the buried ones' bytes."""
        return len(self._live), len(self._buried), self.buried_bytes


def checked_group(value: str) -> str:
    """``value`` as a call's group. Raises ``BadGroup`` naming the rule for one that breaks it."""
    try:
        group = jobs.check_group(value)
    except ValueError as exc:
        raise BadGroup(str(exc)) from exc
    assert group is not None
    return group
