"""The proxy's exception tree, split by whose fault it is; each carries its HTTP status.

::

    ProxyError                      status  outcome
    ├── ClientError                  4xx    rejected   the client's input is refused
    │   ├── BodyTooLarge             413
    │   ├── ExpectationFailed        417  an Expect other than 100-continue
    │   └── BadRequestId             400
    ├── Overloaded                   503    rejected   --max-concurrent-streams reached, or draining
    └── UpstreamError                5xx    upstream_error
        ├── UpstreamUnavailable      503    the upstream refused the connection (down)
        ├── UpstreamBroken           502    the upstream broke off or answered garbage
        └── UpstreamTimeout          504    no connection within --upstream-connect-timeout
    ConfigError (ValueError)                bad flags or environment, raised before serving

Foreign exceptions (aiohttp's, OSError) are translated where they are caught, with
``raise … from exc``; only ``ProxyError`` reaches the code that writes error responses.
"""

from __future__ import annotations

from proxy.vocabulary import Outcome


class ProxyError(Exception):
    """A call the proxy ends with an error response of its own."""

    status = 500
    outcome = Outcome.UPSTREAM_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ClientError(ProxyError):
    status = 400
    outcome = Outcome.REJECTED


class BodyTooLarge(ClientError):
    status = 413


class ExpectationFailed(ClientError):
    status = 417


class BadRequestId(ClientError):
    status = 400


class Overloaded(ProxyError):
    status = 503
    outcome = Outcome.REJECTED


class UpstreamError(ProxyError):
    status = 502
    outcome = Outcome.UPSTREAM_ERROR


class UpstreamUnavailable(UpstreamError):
    status = 503


class UpstreamBroken(UpstreamError):
    status = 502


class UpstreamTimeout(UpstreamError):
    status = 504


class ConfigError(ValueError):
    """Bad flags or environment: the process exits with this message before serving."""
