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
