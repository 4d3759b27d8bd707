"""gRPC metadata rules for relaying one call: what passes each way, and the call ids.

No I/O: metadata in, metadata out. gRPC sets some fields itself on each hop (``grpc-*`` and
pseudo-headers) and some describe one HTTP/2 connection; those are never relayed. Upstream, the
call carries its id as ``x-request-id`` (and the client's own as ``x-client-request-id`` when it
differs); the client always gets the call id back in the initial metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hangup_contract import request_id as request_ids
from proxy.calls.request_ids import CLIENT_REQUEST_ID, RequestIds

Metadata = tuple[tuple[str, str | bytes], ...]
_REQUEST_ID = request_ids.METADATA_KEY
_CLIENT_REQUEST_ID = CLIENT_REQUEST_ID.lower()
# Set by gRPC itself on each hop, or describing one HTTP/2 connection: never relayed.
_CONNECTION_SCOPED = frozenset(
    {"user-agent", "te", "content-type", "connection", "keep-alive", "host", "transfer-encoding"}
)


def relayable(metadata: Sequence[tuple[str, Any]]) -> Metadata:
    """``metadata`` without what gRPC sets per hop (reserved, pseudo and connection fields)."""
    return tuple(
        (key, value)
        for key, value in metadata
        if not key.startswith(("grpc-", ":")) and key not in _CONNECTION_SCOPED
    )


def upstream_metadata(metadata: Sequence[tuple[str, Any]], ids: RequestIds) -> Metadata:
    """What goes upstream: the client's metadata with the call id (and the client's own id)."""
    kept = tuple(
        (k, v) for k, v in relayable(metadata) if k not in (_REQUEST_ID, _CLIENT_REQUEST_ID)
    )
    extra: Metadata = ((_REQUEST_ID, ids.upstream),)
    if ids.client is not None and ids.client != ids.upstream:
        extra += ((_CLIENT_REQUEST_ID, ids.client),)
    return kept + extra


def client_metadata(metadata: Sequence[tuple[str, Any]], request_id: str) -> Metadata:
    """The upstream's initial metadata for the client, always naming the call id."""
    kept = tuple((k, v) for k, v in relayable(metadata) if k != _REQUEST_ID)
    return (*kept, (_REQUEST_ID, request_id))
