"""The id that names every upstream call, and the one rule for it.

Every call from the proxy to the gateway carries its id in the ``X-Request-Id`` header (the
``x-request-id`` metadata key on gRPC); cancel calls name the call by it, and both sides' logs
carry it. An id is 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``: it goes unescaped into a
header, a URL path and a log line, and junk cannot pass for someone else's id. Fresh ids are
128 random bits as 32 hex digits.
"""

from __future__ import annotations

import re
import secrets

HEADER = "X-Request-Id"
METADATA_KEY = "x-request-id"
RULE = "1-128 characters of A-Z a-z 0-9 . _ : -"
_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def is_valid(request_id: str) -> bool:
    """Whether ``request_id`` follows the rule."""
    return _PATTERN.fullmatch(request_id) is not None


def new_request_id() -> str:
    """A fresh 128-bit random id, as 32 hex digits."""
    return secrets.token_hex(16)
