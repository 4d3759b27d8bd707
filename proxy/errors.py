"""The proxy's exception tree: everything the proxy raises, split by whose fault it is; each
carries the HTTP status and outcome of a call it ends.

::

    ProxyError                      status  outcome
    ├── ClientError                  4xx    rejected   the client's input is refused
    │   ├── RemoteProtocolError      4xx/5xx  the client broke HTTP/1.1 or a head rule
    │   │   │                        (``proxy.http.core``): 400, 414, 431, 501, 505, each its own
    │   │   └── BadBody              400  a request body that breaks off (a broken chunk)
    │   ├── BodyTooLarge             413
    │   ├── BodyTimeout              408  no body bytes for --body-timeout
    │   ├── ExpectationFailed        417  an Expect other than 100-continue
    │   ├── BadRequestId             400
    │   ├── BadGroup                 400  a group (X-Hangup-Group) that breaks the id rule
    │   ├── TooManyGroupCalls        429  past --max-groups or --max-group-calls
    │   └── DuplicateRequestId       409  a trusted id another call holds (gRPC ALREADY_EXISTS)
    ├── CancelledById                499    cancelled  a cancel by id on the proxy's own API
    ├── ClientGone                   499    cancelled  the client left: nothing more can be sent
    ├── ProxyTimeout                 504    cancelled  the call ran past --max-request-duration
    ├── LocalProtocolError           500    the HTTP/1.1 core (``proxy.http.core``) asked out
    │                                       of turn by its glue: the proxy's bug, not the client's
    ├── Overloaded                   503    rejected   --max-concurrent-streams reached, or draining
    │   └── WorkerSilent                        a worker did not say whether it holds a trusted id
    └── UpstreamError                5xx    upstream_error
        ├── UpstreamUnavailable      503    the upstream refused the connection (down)
        ├── UpstreamBroken           502    the upstream broke off or answered garbage
        │   └── StaleConnection             a connection closed before any byte of the answer
        │                                   (a reused one is resent on a fresh connection once)
        ├── UpstreamTimeout          504    no connection within --upstream-connect-timeout
        └── CancelAttemptFailed             one cancel attempt failed; retried until its deadline
    hangup_contract.runtime.options.ConfigError (ValueError): bad flags or environment, raised
    before serving (one class for both processes)

Foreign exceptions (aiohttp's, OSError) are translated where they are caught, with
``raise … from exc``; only ``ProxyError`` reaches the code that writes error responses.
"""

from __future__ import annotations

from proxy.labels import Outcome


class ProxyError(Exception):
    """A call the proxy ends with an error response of its own."""

    status = 500
    outcome = Outcome.UPSTREAM_ERROR
    kind = "proxy_error"  # the error's "type" in its JSON answer

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ClientError(ProxyError):
    status = 400
    outcome = Outcome.REJECTED


class BodyTooLarge(ClientError):
    status = 413


class BodyTimeout(ClientError):
    status = 408


class RemoteProtocolError(ClientError):
    """The client broke HTTP/1.1, or a rule of the proxy's for request heads
    (``proxy.http.head_rules``): what ``proxy.http.core`` refuses, with the status it answers
    (h11's name; its ``LocalProtocolError`` below)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class BadBody(RemoteProtocolError):
    """A request body that cannot be framed (a broken chunked encoding): raised to its reader."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


class ExpectationFailed(ClientError):
    status = 417


class BadRequestId(ClientError):
    status = 400


class BadGroup(ClientError):
    status = 400


class TooManyGroupCalls(ClientError):
    """Past a bound on the groups a worker holds (``proxy.calls.groups``)."""

    status = 429


class DuplicateRequestId(ClientError):
    """A client's own id (``--trust-client-request-id``) that another call holds: sent upstream,
    its hang-up's cancel would name the other call (``proxy.calls.held``)."""

    status = 409


class CancelledById(ProxyError):
    """Cancelled by id (``proxy.http.cancel_api``) before its answer began, or before it
    arrived: answered as the gateway answers a cancelled call."""

    status = 499
    outcome = Outcome.CANCELLED
    kind = "cancelled"


class ClientGone(ProxyError):
    """Sending to the client failed: its connection (or its gRPC call) is gone."""

    status = 499  # nginx's "client closed request"
    outcome = Outcome.CANCELLED


class ProxyTimeout(ProxyError):
    status = 504
    outcome = Outcome.CANCELLED


class Overloaded(ProxyError):
    status = 503
    outcome = Outcome.REJECTED


class WorkerSilent(Overloaded):
    """With ``--workers``: a worker did not say in time whether it holds a call's trusted id
    (it may: the call is not sent; gRPC ``UNAVAILABLE``)."""


class UpstreamError(ProxyError):
    status = 502
    outcome = Outcome.UPSTREAM_ERROR


class UpstreamUnavailable(UpstreamError):
    status = 503


class UpstreamBroken(UpstreamError):
    status = 502


class UpstreamTimeout(UpstreamError):
    status = 504


class StaleConnection(UpstreamBroken):
    """The connection ended before any byte of the answer (the server had closed it)."""


class CancelAttemptFailed(UpstreamError):
    """One cancel attempt failed in a way another attempt may fix (the cancel endpoint is down,
    slow, overloaded, or answered what is not HTTP/1.1): the canceller retries until the
    cancel's deadline."""


class LocalProtocolError(ProxyError):
    """The HTTP/1.1 core (``proxy.http.core``) was asked what its state does not allow (an answer
    with no request served): a bug in its glue, not the client's doing."""
