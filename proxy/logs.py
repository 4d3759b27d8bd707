"""Structured logging: one JSON object per line on stderr.

Each relayed call ends in exactly one record (message ``call``) carrying ``Call.record()``;
other records (startup, cancel retries, shutdown) use the same shape with a ``msg`` field.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

CALL_LOGGER = "hangup.proxy.call"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str) -> None:
    """Send every ``hangup.*`` record to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("hangup")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def log_call(fields: dict[str, object]) -> None:
    logging.getLogger(CALL_LOGGER).info("call", extra={"fields": fields})
