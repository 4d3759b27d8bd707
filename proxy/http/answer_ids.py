"""An answer's own id, read from its first bytes once: what a streaming client knows its call by.

A client that set no ``X-Request-Id`` learns its call's name from the answer: the ``id`` of the
first SSE event (``data: {"id": "chatcmpl-…", …}``) or of the JSON answer (``{"id": "cmpl-…",
…}``), as ``vllm serve`` and hangup's gateway write them (the ``id`` first). With the cancel API
on, the relay reads that id (and the ``model`` beside it) from at most :data:`WATCH_BYTES` of
the answer's first bytes, once per call, and the call is held under it too
(``HeldCalls.name``): a cancel by it then ends the call (Rapid-MLX issue 2342 is a server that
could not). No event after the first is looked at; an answer whose first object does not open
with an ``id`` that keeps the id rule is named by nothing more.

No I/O: bytes in, an id out.
"""

from __future__ import annotations

import re

WATCH_BYTES = 1024
"""The most of an answer's first bytes read for its id."""
_DECIDED = 300
"""Bytes after which an answer with no ``id`` yet never opens with one (a prefix, the key and
an id of 128 characters fit well within)."""
_ID = re.compile(rb'\A\s*(data:[ \t]*)?\{\s*"id"\s*:\s*"([A-Za-z0-9._:\-]{1,128})"')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\\r\n]{1,256})"')


class FirstBytes:
    """What an answer's first bytes say, read as they come (:meth:`feed` until it says it is
    done): its ``id``, its ``model``, whether it is an event stream (its first event ``data:``)."""

    __slots__ = ("_head", "answer_id", "model", "streaming")

    def __init__(self) -> None:
        self._head = b""
        self.answer_id: str | None = None
        self.model: str | None = None
        self.streaming: bool | None = None

    def feed(self, chunk: bytes) -> bool:
        """Read ``chunk`` (the answer's next bytes); True once nothing more is to be read."""
        head = self._head
        head = chunk if not head and len(chunk) <= WATCH_BYTES else head + chunk
        head = head[:WATCH_BYTES]  # (no copy when it is shorter)
        found = _ID.match(head)
        if found is None:
            self._head = head
            return len(head) >= _DECIDED or b"\n\n" in head  # long enough, or a whole event
        self.answer_id = found.group(2).decode("ascii")
        self.streaming = found.group(1) is not None
        model = _MODEL.search(head, found.end())
        if model is not None:
            self.model = model.group(1).decode("utf-8", errors="replace")
        self._head = b""
        return True
