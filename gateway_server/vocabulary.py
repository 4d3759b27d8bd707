"""Why a request ended and where it was: the one vocabulary of the gateway.

Every metric label, log field and HTTP/gRPC status mapping about a request's end comes from these
enums. Their values are wire values (DESIGN.md): dashboards, alerts and the proxy depend on them.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why a request was cancelled."""

    CLIENT_DISCONNECT = "client_disconnect"
    GRPC_CANCELLED = "grpc_cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    PROXY_TIMEOUT = "proxy_timeout"
    SHUTDOWN = "shutdown"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, value: str | None) -> Reason:
        """The reason named by a cancel call; ``explicit`` when none is given.

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
    """Where an engine request is: waiting for a slot, reading its prompt, or generating."""

    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def rank(self) -> int:
        return _PHASE_ORDER.index(self)


_PHASE_ORDER = (Phase.QUEUED, Phase.PREFILL, Phase.DECODE)


class Outcome(enum.StrEnum):
    """How a request ended (``hangup_gateway_requests_total{outcome}``)."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    ERROR = "error"
    REJECTED = "rejected"


class Protocol(enum.StrEnum):
    """Which API a request came in through (``protocol`` label)."""

    OPENAI = "openai"
    KSERVE_HTTP = "kserve_http"
    KSERVE_GRPC = "kserve_grpc"
