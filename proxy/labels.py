"""Why a proxied call ended, what the client had seen, and what the cancel call achieved.

The proxy's own words: every metric label, log field and status mapping about a call's end comes
from these enums and from the contract's ``Reason`` (``hangup_contract.cancel_labels``), which the
proxy sends with each cancel call and the gateway counts.
"""

from __future__ import annotations

import enum

SERVER_HEADER = "hangup-proxy"
"""What every response the proxy answers itself, and every relayed one, names as its ``Server``:
no implementation, no version."""


class Stage(enum.StrEnum):
    """What the client had seen when it left: nothing yet, or part of the response."""

    BEFORE_RESPONSE = "before_response"
    STREAMING = "streaming"


class CancelResult(enum.StrEnum):
    """The outcome of one explicit cancel call, retries included."""

    OK = "ok"  # the upstream cancelled a running request
    FINISHED = "finished"  # the request had already ended upstream
    NOT_FOUND = "not_found"  # the upstream never saw that id (it keeps a tombstone for it)
    ERROR = "error"  # the upstream refused the call for good (bad token, bad request)
    GAVE_UP = "gave_up"  # no answer before the cancel deadline, retries included


class Outcome(enum.StrEnum):
    """How a proxied call ended (``hangup_proxy_requests_total{outcome}``)."""

    COMPLETED = "completed"  # the response was relayed to its end (whatever its status)
    CANCELLED = "cancelled"  # the client left, a proxy limit fired, or the proxy shut down
    UPSTREAM_ERROR = "upstream_error"  # the upstream was down, refused, timed out or broke off
    REJECTED = "rejected"  # the proxy refused the call itself (limits, bad input, draining)


class TokenKind(enum.StrEnum):
    """Which tokens of a server's own ``usage`` (``hangup_proxy_cancelled_usage_tokens_total``)."""

    PROMPT = "prompt"
    COMPLETION = "completion"


class CallProtocol(enum.StrEnum):
    """Which listener a call came in through (the ``protocol`` label)."""

    HTTP = "http"
    GRPC = "grpc"
