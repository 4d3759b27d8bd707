"""How a request ended and which API it came through: the gateway's own words.

Every metric label, log field and HTTP/gRPC status mapping about a request's end comes from these
enums and from the contract's (``hangup_contract.cancel_labels``: ``Reason``, ``Phase``). Their
values label metrics: dashboards and alerts depend on them.
"""

from __future__ import annotations

import enum


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


class Refusal(enum.StrEnum):
    """Why a listener refused a call (``hangup_gateway_calls_refused_total{reason}``)."""

    TOO_MANY_CALLS = "too_many_calls"
    TOO_MANY_CLIENT_CALLS = "too_many_client_calls"
