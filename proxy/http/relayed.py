"""The server's own usage, read from the end of an answer the relay passed on, once a call has
ended cancelled (no I/O).

The relay parses nothing per event: its sink keeps a reference to the last piece it wrote (one
upstream read's bytes; ``proxy.http.exchange.ClientSink``), and this module reads it once, at
the call's end, and only for a call that ended cancelled. What it finds there, last first:

- an event stream's last ``data:`` event that names ``usage`` (OpenAI's usage chunk, or a
  ``continuous_usage_stats`` chunk of ``vllm serve``; the error event hangup's gateway ends a
  cancelled stream with) or KServe ``parameters`` with the same counts (hangup's gateway on
  ``generate_stream``);
- else a whole JSON body that names one of them (hangup's gateway's 499).

Bounded: at most :data:`TAIL_BYTES` of the answer's end are read, and one JSON text at most
that long is parsed. An answer whose usage is further back, or cut between two pieces, says
nothing: the call's usage is then unknown (None), never guessed. (The servers it is meant for
put it last and whole: ``vllm serve``'s every chunk with ``continuous_usage_stats``, the error
event that ends hangup's gateway's cancelled streams.)
"""

from __future__ import annotations

import json
from typing import Any

from hangup_contract.usage import Usage, read_usage

TAIL_BYTES = 64 * 1024
"""How much of an answer's end is read for its usage."""
_NAMES = (b'"usage"', b'"parameters"')


def usage_in(tail: bytes) -> Usage | None:
    """The usage the end of an answer names (``tail``: its last bytes, an event stream's or one
    JSON body's, read only if ``tail`` holds it whole), or None."""
    tail = tail[-TAIL_BYTES:]
    if not any(name in tail for name in _NAMES):
        return None
    return _last_event(tail) or _named(_json(tail))


def _last_event(tail: bytes) -> Usage | None:
    end = len(tail)
    while (start := tail.rfind(b"data:", 0, end)) >= 0:
        line = tail[start + 5 : end].split(b"\n", 1)[0]
        if any(name in line for name in _NAMES):
            found = _named(_json(line))
            if found is not None:
                return found
        end = start
    return None


def _json(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # cut, not JSON, nested too deep
        return None


def _named(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    return read_usage(value.get("usage")) or read_usage(value.get("parameters"))
