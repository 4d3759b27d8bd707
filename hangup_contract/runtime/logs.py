"""Log lines: one JSON object per line on stderr, the same shape in the gateway and the proxy.

::

    {"ts": "2026-11-23T01:02:03.456Z", "level": "info", "logger": "hangup.gateway",
     "msg": "request_end", "request_id": "...", ..., "exc": "Traceback ..."}

``msg`` names what happened (``call``, ``request_end``, ``serving``, ...) or is a sentence; the
structured fields of an event come from :func:`log_event` (or ``extra={"fields": {...}}``);
``exc`` is there only when an exception was logged. Every ``hangup.*`` logger writes this way,
and so does every other logger that has no handler of its own (aiohttp, grpc, asyncio's
"Exception in callback", Python's warnings), at WARNING or above: without that, their records
reached stderr through Python's last-resort handler, as plain text and tracebacks of many lines
between the JSON lines. (vLLM configures its own handler and keeps its format.)
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any


class JsonFormatter(logging.Formatter):
    def __init__(self, common: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._common = dict(common or {})

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self._common,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str, common: Mapping[str, Any] | None = None) -> None:
    """Send every ``hangup.*`` record at ``level`` or above, and every other library's at
    WARNING or above (``level`` if higher), to stderr as JSON lines, each with the ``common``
    fields (a proxy worker's ``worker``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(common))
    ours = logging.getLevelName(level.upper())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.WARNING, ours))
    hangup = logging.getLogger("hangup")
    hangup.handlers.clear()
    hangup.setLevel(ours)
    hangup.propagate = True  # to the root's handler, whatever the root's own level
    logging.captureWarnings(True)


def log_event(
    logger: logging.Logger, name: str, level: int = logging.INFO, /, **fields: Any
) -> None:
    """One line saying ``name`` happened, with ``fields``."""
    logger.log(level, name, extra={"fields": fields})
