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

from aiohttp.http_exceptions import HttpProcessingError

CALL_LOGGER = "hangup.proxy.call"
SERVER_LOGGER = "hangup.proxy.http.server"  # what aiohttp's HTTP server logs


class BadRequestFilter(logging.Filter):
    """Turns aiohttp's traceback for a request it could not parse (answered 400 already) into
    a one-line warning: a malformed request is the client's fault, not the proxy's. Exceptions
    from the proxy's own code keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.exc_info = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            client = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg, record.args = "bad request from %s: %s", (client, exc.message)
        return True


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


def server_logger() -> logging.Logger:
    """The logger handed to aiohttp's HTTP server, with ``BadRequestFilter`` on it (once)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, BadRequestFilter) for f in logger.filters):
        logger.addFilter(BadRequestFilter())
    return logger


def log_call(fields: dict[str, object]) -> None:
    logging.getLogger(CALL_LOGGER).info("call", extra={"fields": fields})
