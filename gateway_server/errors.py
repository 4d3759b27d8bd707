"""The gateway's exception tree. Each error carries its HTTP status; the gRPC layer maps the
same classes to gRPC codes. Handlers raise these; one middleware per protocol renders them.

    GatewayError                      (500)
    ├── ClientError                   (400)  the request is wrong; nothing else is affected
    │   ├── InvalidRequest            (400)
    │   ├── RequestTooLarge           (413)
    │   ├── BodyTimeout               (408)  no body bytes for --body-timeout
    │   ├── Unauthorized              (401)
    │   ├── ModelNotFound             (404)
    │   ├── RequestNotFound           (404)
    │   ├── PathNotFound              (404)  no such endpoint (OpenAI shape under /v1)
    │   ├── MethodNotAllowed          (405)
    │   ├── DuplicateRequestId        (409)
    │   ├── TooManyRequests           (429)  a bound on what a client may hold was reached
    │   └── CancelledBeforeArrival    (499)  a cancel for this id arrived first (tombstone)
    ├── NotImplementedForModel        (501)  a path the model cannot serve (/infer: decoupled)
    ├── Unavailable                   (503)  draining, no live worker
    ├── EngineFailure                 (500)  the engine failed this request
    └── CancelledWhileRunning         (499)  cancelled before any of the answer was sent

    RequestCancelled (not a GatewayError): raised into a handler whose engine request was
    cancelled; the handler ends its stream, or answers with CancelledWhileRunning.
"""

from __future__ import annotations

from hangup_contract.cancel_labels import Reason
from hangup_contract.usage import Usage


class GatewayError(Exception):
    status = 500
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ClientError(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class RequestTooLarge(ClientError):
    status = 413


class BodyTimeout(ClientError):
    status = 408


class Unauthorized(ClientError):
    status = 401
    error_type = "authentication_error"


class ModelNotFound(ClientError):
    status = 404
    error_type = "not_found_error"


class RequestNotFound(ClientError):
    status = 404
    error_type = "not_found_error"


class PathNotFound(ClientError):
    status = 404
    error_type = "not_found_error"


class MethodNotAllowed(ClientError):
    status = 405
    error_type = "invalid_request_error"


class DuplicateRequestId(ClientError):
    status = 409
    error_type = "conflict_error"


class TooManyRequests(ClientError):
    status = 429
    error_type = "rate_limit_error"


class CancelledBeforeArrival(ClientError):
    """The request's id was cancelled before the request arrived; it is rejected unrun."""

    status = 499
    error_type = "cancelled"

    def __init__(self, request_id: str, reason: Reason) -> None:
        super().__init__(f"request {request_id} was cancelled ({reason}) before it arrived")
        self.reason = reason


class NotImplementedForModel(GatewayError):
    """A KServe path the served model cannot answer, as Triton answers it: 501."""

    status = 501
    error_type = "not_implemented"


class Unavailable(GatewayError):
    status = 503
    error_type = "unavailable"


class EngineFailure(GatewayError):
    status = 500
    error_type = "engine_error"


class CancelledWhileRunning(GatewayError):
    """A non-streaming request cancelled while it ran: answered 499 (nothing was sent yet),
    saying what the call consumed up to the cancel (``usage``) where the protocol has room."""

    status = 499
    error_type = "cancelled"

    def __init__(self, reason: Reason, usage: Usage | None = None) -> None:
        super().__init__(f"request cancelled ({reason})")
        self.usage = usage


class RequestCancelled(Exception):
    """Raised into a handler when its engine request was cancelled (not an error: a way out).
    ``usage``: what the engine request consumed, filled in once its books closed (before it
    leaves ``GenerationService.generate``)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"cancelled: {reason}")
        self.reason = reason
        self.usage = Usage()
