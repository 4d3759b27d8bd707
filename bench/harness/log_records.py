"""What a pod's log pipeline reads: every line of a process's log is one JSON record.

Shared by the tests that read logs: a line that is not a record (a traceback, a library's
plain-text message) is what a pipeline trips on, and an error record from a library rather
than hangup's own loggers is an error nobody wrote on purpose.
"""

from __future__ import annotations

import json
from typing import Any


def records(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as its record; ``AssertionError`` quoting the lines that are not
    one."""
    parsed, stray = _parse(text)
    assert not stray, "lines that are not JSON records:\n" + "\n".join(stray[:20])
    return parsed


def stray_lines(text: str) -> list[str]:
    """The lines of ``text`` a log pipeline would trip on: not a JSON record, or an error record
    of a library (aiohttp, gRPC, asyncio) rather than hangup's own. A client hanging up at any
    point is no error of the server's."""
    parsed, stray = _parse(text)
    for record in parsed:
        if record["level"] in ("error", "critical") and not record["logger"].startswith("hangup."):
            stray.append(json.dumps(record)[:2000])
    return stray


def _parse(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    parsed: list[dict[str, Any]] = []
    stray: list[str] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            stray.append(line)
            continue
        if isinstance(record, dict):
            parsed.append(record)
        else:
            stray.append(line)
    return parsed, stray
