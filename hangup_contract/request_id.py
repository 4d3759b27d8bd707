"""The id that names every upstream call, and the one rule for it.

Every call from the proxy to the gateway carries its id in the ``X-Request-Id`` header (the
``x-request-id`` metadata key on gRPC); cancel calls name the call by it, and both sides' logs
carry it. An id is 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``: it goes unescaped into a
header, a URL path and a log line, and junk cannot pass for someone else's id. Fresh ids are
128 random bits as 32 hex digits.
"""

from __future__ import annotations

import os
import re
import threading

HEADER = "X-Request-Id"
METADATA_KEY = "x-request-id"
RULE = "1-128 characters of A-Z a-z 0-9 . _ : -"
MAX_LENGTH = 128
"""The longest id the rule allows (the pattern's upper bound); also the longest a client's own
name for one request of a call may be (a Triton request's ``id``: any characters)."""
_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def is_valid(request_id: str) -> bool:
    """Whether ``request_id`` follows the rule."""
    return _PATTERN.fullmatch(request_id) is not None


_IDS_PER_READ = 256


class _Pool(threading.local):
    """Random bytes for ids, read from the OS 256 ids at a time (one ``getrandom`` a call was a
    system call per relayed call), a pool per thread."""

    def __init__(self) -> None:
        self.bytes = b""
        self.at = 0


_pool = _Pool()


def _forget_pool() -> None:
    _pool.bytes, _pool.at = b"", 0  # a forked child must not hand out its parent's next ids


os.register_at_fork(after_in_child=_forget_pool)


def new_request_id() -> str:
    """A fresh 128-bit random id (from the OS's random source), as 32 hex digits."""
    pool = _pool
    at = pool.at
    if at >= len(pool.bytes):
        pool.bytes, at = os.urandom(16 * _IDS_PER_READ), 0
    pool.at = at + 16
    return pool.bytes[at : at + 16].hex()


ALIAS_MAX = 128 + 1 + 128
"""The longest cancel id: a gRPC stream's request alias, ``<call id>:<the request's id>``."""
CANCEL_RULE = (
    f"a request id ({RULE}), or a stream request's alias '<call id>:<its id>' of at most "
    f"{ALIAS_MAX} characters"
)


def is_cancel_id(value: str) -> bool:
    """Whether ``value`` may name something to cancel: a request id (the rule), or the alias of
    one request of a gRPC stream, ``<call id>:<the request's id>``: a call id by the rule, a
    colon, then the client's own id for that request (any characters; the whole at most
    ``ALIAS_MAX``). Anything else names nothing the gateway holds, and is refused before it is
    looked up, forwarded or remembered."""
    if len(value) > ALIAS_MAX:
        return False
    if _PATTERN.fullmatch(value) is not None:
        return True
    call_id, colon, own = value.partition(":")
    return bool(colon and own) and _PATTERN.fullmatch(call_id) is not None
