"""gRPC metadata rules for relaying one call: what passes each way, and the call ids.

No I/O: metadata in, metadata out. gRPC sets some fields itself on each hop (``grpc-*`` and
pseudo-headers) and some describe one HTTP/2 connection; those are never relayed. Upstream, the
call carries its id as ``x-request-id`` (and the client's own as ``x-client-request-id`` when it
differs); the client always gets the call id back in the initial metadata. As on HTTP, the
client's address is appended to ``x-forwarded-for`` (after what the client sent there, its fields
joined): the last element is the one no client can write, which the gateway's fair shares read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hangup_contract import request_id as request_ids
from hangup_contract.peers import peer_host
from proxy.calls.request_ids import CLIENT_REQUEST_ID, RequestIds

Metadata = tuple[tuple[str, str | bytes], ...]
_REQUEST_ID = request_ids.METADATA_KEY
_CLIENT_REQUEST_ID = CLIENT_REQUEST_ID.lower()
_FORWARDED_FOR = "x-forwarded-for"
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


def peer_address(peer: str | None) -> str | None:
    """The client's host in a gRPC peer string (``hangup_contract.peers``); None for a peer with
    no network address (``unix:``)."""
    if not peer or peer.startswith("unix:"):
        return None
    return peer_host(peer) or None


def upstream_metadata(
    metadata: Sequence[tuple[str, Any]], ids: RequestIds, client_addr: str | None = None
) -> Metadata:
    """What goes upstream: the client's metadata with the call id (and the client's own id),
    ``client_addr`` appended to ``x-forwarded-for``."""
    forwarded_for: list[str] = []
    kept: list[tuple[str, Any]] = []
    for key, value in relayable(metadata):
        if key == _FORWARDED_FOR and client_addr:
            if isinstance(value, str):
                forwarded_for.append(value)
        elif key not in (_REQUEST_ID, _CLIENT_REQUEST_ID):
            kept.append((key, value))
    if client_addr:
        kept.append((_FORWARDED_FOR, ", ".join([*forwarded_for, client_addr])))
    kept.append((_REQUEST_ID, ids.upstream))
    if ids.client is not None and ids.client != ids.upstream:
        kept.append((_CLIENT_REQUEST_ID, ids.client))
    return tuple(kept)


def client_metadata(metadata: Sequence[tuple[str, Any]], request_id: str) -> Metadata:
    """The upstream's initial metadata for the client, always naming the call id."""
    kept = tuple((k, v) for k, v in relayable(metadata) if k != _REQUEST_ID)
    return (*kept, (_REQUEST_ID, request_id))
