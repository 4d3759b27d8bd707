"""What aiohttp's HTTP server logs, in the proxy's shape: a request it could not parse is the
client's fault, a one-line warning (each call's own record is ``proxy.lifecycle.log_call``)."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

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


def server_logger() -> logging.Logger:
    """The logger handed to aiohttp's HTTP server, with ``BadRequestFilter`` on it (once)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, BadRequestFilter) for f in logger.filters):
        logger.addFilter(BadRequestFilter())
    return logger
