"""The words both sides use about a cancellation; their values cross the wire and label metrics.

- ``Reason``: why a call was cancelled. The proxy sends it with every cancel call; the gateway
  counts it in ``hangup_gateway_cancellations_total{reason}``.
- ``Phase``: where an engine request was when the cancel hit it (the cancel answer's ``phase``,
  the ``phase`` label).
- ``CancelState``: what a cancel found: a running call it cancelled, or one that had finished.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why a call was cancelled."""

    CLIENT_DISCONNECT = "client_disconnect"
    GRPC_CANCELLED = "grpc_cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    PROXY_TIMEOUT = "proxy_timeout"
    SHUTDOWN = "shutdown"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, value: str | None) -> Reason:
        """The reason a cancel call names; ``explicit`` when it names none.

        Raises ``ValueError`` naming the accepted values when ``value`` is not one of them.
        """
        if value is None:
            return cls.EXPLICIT
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(r.value for r in cls)
            raise ValueError(f"unknown reason {value!r}; expected one of: {accepted}") from None


class Phase(enum.StrEnum):
    """Where an engine request is: waiting for a slot, reading its prompt, its prompt's KV cache
    on the way from a prefill worker to a decode worker (disaggregated serving only), or
    generating.

    Members in order of progress (``rank``): a new phase goes where it falls in that order,
    and every label set, listing and answer that names phases takes it from here."""

    QUEUED = "queued"
    PREFILL = "prefill"
    TRANSFER = "transfer"
    DECODE = "decode"

    @property
    def rank(self) -> int:
        """Order of progress: the member's position (queued < prefill < transfer < decode)."""
        return _PHASE_RANK[self]


_PHASE_RANK = {phase: rank for rank, phase in enumerate(Phase)}


class CancelState(enum.StrEnum):
    """What a cancel found (the answer's ``state``)."""

    CANCELLED = "cancelled"  # it was running, and is now cancelled
    FINISHED = "finished"  # it had already ended (cancelling is idempotent)
