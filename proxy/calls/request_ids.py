"""The id of each call the proxy relays, for both protocols: the HTTP relay reads the client's
``X-Request-Id`` header, the gRPC relay its ``x-request-id`` metadata, and both choose here.

The id sent upstream is the one every cancel call names. It is fresh for each call unless the
operator trusts clients' own ids (``--trust-client-request-id``); then a client's id is kept when
it keeps the contract's rule (``hangup_contract.request_id``) and refused when it does not. A
client id that is not kept still reaches the upstream, as ``X-Client-Request-Id``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from hangup_contract import request_id as request_ids
from proxy.errors import BadRequestId

REQUEST_ID = request_ids.HEADER
CLIENT_REQUEST_ID = "X-Client-Request-Id"


class RequestIds(NamedTuple):  # made for every call: a tuple is the cheapest frozen record
    upstream: str  # the id of the upstream call: the one cancel calls name
    client: str | None  # what the client sent as X-Request-Id, if anything


def choose_request_ids(fields: Iterable[tuple[str, str]], *, trust_client: bool) -> RequestIds:
    """The upstream call's id, from a call's header fields or metadata (:func:`request_ids_for`
    the first ``X-Request-Id`` among them)."""
    wanted = REQUEST_ID.lower()
    client = next((value for key, value in fields if key.lower() == wanted), None)
    return request_ids_for(client, trust_client=trust_client)


def request_ids_for(client: str | None, *, trust_client: bool) -> RequestIds:
    """The upstream call's id for a call whose client sent ``client`` as its id: fresh, or the
    client's own when trusted.

    Raises ``BadRequestId`` when the client's id is trusted but breaks the contract's rule.
    """
    if not trust_client or client is None:
        return RequestIds(request_ids.new_request_id(), client)
    if not request_ids.is_valid(client):
        raise BadRequestId(f"{REQUEST_ID} must be {request_ids.RULE}")
    return RequestIds(client, client)
