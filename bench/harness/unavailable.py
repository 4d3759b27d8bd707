"""``Unavailable``: a thing this machine does not have (a server, a tool, an engine), with why and
how to get it in its message. It is the one exception that means "absent": the tests' plugin
(``tests/support/skips.py``) turns it into a skip, and CI (``--require-all``) into a failure; the
benchmarks print it and go on. Any other exception, ``LookupError`` and ``KeyError`` included,
is a bug and reads as one."""

from __future__ import annotations


class Unavailable(Exception):
    """Not here: the message says what is missing and how to get it."""
