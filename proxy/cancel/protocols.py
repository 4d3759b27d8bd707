"""The seams of the cancel path: what an adapter is, and what it may also do.

- :class:`CancelAdapter`: one attempt to cancel an upstream call by id (the ``Canceller``
  retries). Every adapter is one; ``NoCancelAdapter`` makes no call at all.
- :class:`SendsNow`: an adapter that can put an attempt on the wire before returning.
- :class:`TagsRequests`: an adapter whose upstream reads a call's id from the request body.
- :class:`CancelCall`: what an adapter whose cancel is one HTTP POST says (which POST, what an
  answer means); ``proxy.cancel.http.HttpCancelAdapter`` does the rest. A new server is one
  ``CancelCall`` and a line in ``proxy.cancel.choice``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from hangup_contract.cancel_labels import Reason
from proxy.labels import CancelResult

CancelTask = asyncio.Task[CancelResult | None]
"""A cancel in flight; its result is how it ended (None: the adapter makes no call)."""
Submit = Callable[[str, Reason, float], CancelTask]
"""``submit(request_id, reason, detected_at)``: start the explicit cancel of one upstream call."""


class CancelAdapter(Protocol):
    """How the proxy asks one kind of upstream to cancel a call by id."""

    @property
    def name(self) -> str:
        """The ``adapter`` label value."""
        ...

    @property
    def calls_upstream(self) -> bool:
        """False when the adapter makes no call (nothing is counted for it)."""
        ...

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        """One attempt; raises ``CancelAttemptFailed`` when retrying may help."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SendsNow(Protocol):
    """An adapter that can put an attempt on the wire before returning (no event-loop turn)."""

    def send_now(self, request_id: str, reason: Reason) -> asyncio.Task[CancelResult] | None:
        """Start one attempt now, its answer read by the task; None when it cannot start now."""
        ...


@runtime_checkable
class TagsRequests(Protocol):
    """An adapter whose upstream takes a call's id from the request body, not from a header."""

    def tags(self, method: str, path: str) -> bool:
        """Whether this request's body is read whole and given the call's id."""
        ...

    def tag_body(self, body: bytes, request_id: str) -> bytes:
        """``body`` carrying ``request_id``; raises ``ValueError`` saying why it cannot."""
        ...


class NoCancelAdapter:
    """No cancel call: the upstream learns of a hang-up only from its closed stream
    (``--cancel-adapter none``, and ``vllm`` without its abort endpoint)."""

    calls_upstream = False

    def __init__(self, name: str = "none") -> None:
        self.name = name

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        return CancelResult.OK

    async def close(self) -> None:
        return None


class CancelCall(Protocol):
    """The hooks of an adapter whose cancel is one HTTP POST with a JSON body."""

    @property
    def name(self) -> str:
        """The ``adapter`` label value."""
        ...

    def request(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        """The path (below the cancel URL's prefix) and JSON body that cancel ``request_id``."""
        ...

    def result(self, status: int, text: str) -> CancelResult:
        """What an answer means; raises ``CancelAttemptFailed`` when retrying may help."""
        ...
