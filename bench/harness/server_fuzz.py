"""A byte-level fuzz of the proxy's HTTP/1.1 server side (``proxy.http.core``, its protocol state
with no I/O).

:func:`serve` feeds bytes, cut into reads where the fuzzer says, into one ``HttpCore`` and
carries out what it commands as the glue (``proxy.http.protocol``) does, with a handler that
reads each request's body to its end and records what it was handed: the request that would go
upstream. No event loop, no transport: a read is a call, and the handler answers as soon as the
body it reads has ended, before the next read (what a settled event loop does).
:func:`messages` (Hypothesis) builds requests from parts a client controls: methods, targets,
versions, header fields (``Host``, framing, ``Connection``, ...), bodies by length or in chunks
(extensions, trailers), requests hidden in bodies, several in one write. What must hold for
every input (:func:`violations`):

- at most one request handed on per request in the bytes, each with a method other than
  ``CONNECT``, an origin-form target without a fragment, HTTP/1.0 or 1.1, one ``Host`` (none
  allowed on 1.0), no CR, LF or NUL in a field;
- for bytes built by :func:`messages` and not mutated: nothing a body or a trailer carries in a
  request's head (their fields are named ``X-Trailer-*``, their hidden requests ``/hidden``);
  the requests handed on are those written, in order;
- the same requests and the same bytes back however the input is cut into reads;
- no exception escapes the core, and what is written is a series of well-formed answers.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from proxy.http.core import HttpCore
from proxy.http.events import (
    BodyBroken,
    Close,
    Command,
    Data,
    EndOfMessage,
    Event,
    Linger,
    PauseReading,
    RequestHead,
    ResumeReading,
    Send,
    Serve,
)
from proxy.messages import Answer, error_answer

MAX_HEADER_SIZE = 8190
MAX_HEADERS = 32
_DATE = re.compile(rb"\r\nDate: [^\r]*")


@dataclass
class Handed:
    """A request as the handler received it: what the relay would send upstream."""

    method: str
    target: str
    version: tuple[int, int]
    headers: list[tuple[str, str]]
    body: bytes
    body_error: str | None = None


@dataclass
class Outcome:
    handed: list[Handed] = field(default_factory=list)
    written: bytes = b""
    closed: bool = False
    lingered: bool = False  # answered, then a FIN: nothing more is read
    errors: list[str] = field(default_factory=list)  # what escaped the core

    def comparable(self) -> tuple[list[Handed], bytes, bool]:
        return self.handed, _DATE.sub(b"", self.written), self.closed


@dataclass
class _Parsed:
    head: RequestHead
    body: bytes = b""
    ended: bool = False
    error: str | None = None


def _refusal(status: int, message: str) -> bytes:
    answer = error_answer(status, message)
    answer.force_close()
    return answer.encode("GET", (1, 1), False)[0]


class _Glue:
    """What ``proxy.http.protocol`` does with the core's events and commands, in memory."""

    def __init__(self, outcome: Outcome, max_header_size: int, max_headers: int) -> None:
        self.core = HttpCore(
            max_header_size=max_header_size, max_headers=max_headers,
            refusal_answer=_refusal, now=0.0,
        )  # fmt: skip
        self.outcome = outcome
        self.written = bytearray()
        self.parsing: _Parsed | None = None
        self.waiting: deque[_Parsed] = deque()
        self.serving: _Parsed | None = None
        self.paused = self.shut = False

    def carry_out(self, said: Iterable[Event | Command]) -> None:
        for item in said:
            if isinstance(item, RequestHead):
                self.parsing = _Parsed(item)
                self.waiting.append(self.parsing)
            elif isinstance(item, Data):
                assert self.parsing is not None
                self.parsing.body += item.data
            elif isinstance(item, EndOfMessage | BodyBroken):
                assert self.parsing is not None
                self.parsing.ended = True
                self.parsing.error = None if isinstance(item, EndOfMessage) else "BadBody"
                self.parsing = None
            elif isinstance(item, Serve):
                self.serving = self.waiting.popleft()
                head = self.serving.head
                self.outcome.handed.append(
                    Handed(head.method, head.target, head.version, list(head.headers), b"")
                )
            elif isinstance(item, Send) and not self.shut:
                self.written += item.data
            elif isinstance(item, Linger):
                self.shut = self.outcome.lingered = True  # a FIN: nothing more is written
            elif isinstance(item, Close):
                self.outcome.closed = True
            elif isinstance(item, PauseReading | ResumeReading):
                self.paused = isinstance(item, PauseReading)

    def settle(self) -> None:
        """Answer the request served once its body has ended, and the next, and so on."""
        while (served := self.serving) is not None and served.ended:
            self.serving = None
            handed = self.outcome.handed[-1]
            handed.body, handed.body_error = served.body, served.error
            if served.error is None:
                answer = Answer(200, b"seen %d" % len(self.outcome.handed))
            else:  # the body broke off: the relay answers what it raises
                answer = error_answer(400, "the request body is broken")
            head = served.head
            data, close = answer.encode(head.method, head.version, head.keep_alive)
            if not self.shut:
                self.written += data
            self.carry_out(self.core.answered(0.0, close=close))


def serve(
    reads: list[bytes], *, max_header_size: int = MAX_HEADER_SIZE, max_headers: int = MAX_HEADERS
) -> Outcome:
    """``reads`` through one connection's core, its limits those given."""
    outcome = Outcome()
    glue = _Glue(outcome, max_header_size, max_headers)
    try:
        for data in reads:
            if outcome.closed or glue.paused:  # a real transport would not read on
                break
            glue.carry_out(glue.core.receive(data, 0.0))
            glue.settle()
    except Exception as exc:  # what would escape to the event loop
        outcome.errors.append(repr(exc))
    if glue.serving is not None:  # its body never ended: the client left with it half sent
        outcome.handed[-1].body = glue.serving.body
    outcome.written = bytes(glue.written)
    return outcome


def cut(data: bytes, at: list[int]) -> list[bytes]:
    """``data`` as the reads that end at each of ``at``."""
    edges = sorted({min(max(a, 0), len(data)) for a in at} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


# --- what a client can write ----------------------------------------------------------------

HIDDEN = b"GET /hidden HTTP/1.1\r\nHost: h\r\nX-Trailer-Hidden: 1\r\n\r\n"

# Mostly what a server serves, sometimes what it must refuse: so that most inputs reach the
# handler, where the rules about what it is handed bite.
_methods = st.sampled_from([b"POST"] * 4 + [b"GET"] * 3 + [b"PUT", b"DELETE", b"CONNECT"])
_targets = st.sampled_from(
    [b"/c"] * 12 + [b"/v1/completions?x=1", b"/c#frag", b"*", b"http://h/c", b"h:443"]
)
_versions = st.sampled_from([b"HTTP/1.1"] * 10 + [b"HTTP/1.0"] * 2 + [b"HTTP/2.0", b""])
_hosts = st.sampled_from([[b"a"]] * 12 + [[], [b"a", b"a"], [b"a b"], [b"h:80"], [b"[::1]:80"]])
_FIELDS = {
    b"Connection": [b"close", b"keep-alive", b"upgrade", b"X-A"],
    b"Expect": [b"100-continue", b"other"],
    b"X-Request-Id": [b"id-1"],
    b"Authorization": [b"Bearer head"],
    b"Upgrade": [b"websocket"],
    b"X-A": [b"1", b"x y", b""],
    b"Transfer-Encoding": [b"gzip, chunked"],
}
_fields = st.lists(
    st.sampled_from(sorted(_FIELDS)).flatmap(
        lambda name: st.sampled_from(_FIELDS[name]).map(lambda value: (name, value))
    ),
    max_size=3,
)
_trailers = st.lists(
    st.tuples(st.sampled_from([b"X-Trailer-Auth", b"X-Trailer-Host", b"X-Trailer-Id"]),
              st.sampled_from([b"1", b"x y"])), max_size=3,
)  # fmt: skip


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    method, target, version = draw(_methods), draw(_targets), draw(_versions)
    body = draw(st.sampled_from([b"", b"hello", HIDDEN, b"x" * 300]))
    framing = draw(st.sampled_from(["length", "chunked", "chunked", "none"]))
    head = [method + b" " + target + (b" " + version if version else b"")]
    head += [b"Host: " + host for host in draw(_hosts)]
    head += [n + b": " + v for n, v in draw(_fields)]
    if framing == "length":
        head.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == "chunked":
        head.append(b"Transfer-Encoding: chunked")
        sizes = draw(st.lists(st.integers(1, 64), max_size=4))
        payload, rest = b"", body
        for size in sizes:
            if not rest:
                break
            ext = draw(st.sampled_from([b"", b";a=b", b';q="x"']))
            payload += b"%x%b\r\n%b\r\n" % (len(rest[:size]), ext, rest[:size])
            rest = rest[size:]
        if rest:
            payload += b"%x\r\n%b\r\n" % (len(rest), rest)
        trailer = b"".join(n + b": " + v + b"\r\n" for n, v in draw(_trailers))
        payload += b"0\r\n" + trailer + b"\r\n"
    else:
        payload = b""
    return b"\r\n".join(head) + b"\r\n\r\n" + payload


messages = st.lists(_message(), min_size=1, max_size=3)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes deleted, inserted or replaced (framing bytes favoured)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(out)))
        byte = draw(st.sampled_from([b"\r", b"\n", b" ", b"\t", b":", b"0", b"\x00", b"a", b";"]))
        kind = draw(st.sampled_from(["delete", "insert", "replace"]))
        if kind == "delete" and at < len(out):
            del out[at]
        elif kind == "replace" and at < len(out):
            out[at : at + 1] = byte
        else:
            out[at:at] = byte
    return bytes(out)


# --- what must hold ----------------------------------------------------------------------------

_ANSWER = re.compile(rb"HTTP/1\.1 (\d{3}) [^\r\n]*\r\n")


def statuses(written: bytes) -> list[int] | str:
    """The statuses of the answers written, or why they do not parse."""
    found = []
    rest = written
    while rest:
        matched = _ANSWER.match(rest)
        head_end = rest.find(b"\r\n\r\n")
        if matched is None or head_end < 0:
            return f"not an answer: {rest[:60]!r}"
        head = rest[: head_end + 4]
        length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
        if length is None:
            return f"an answer without a length: {head[:80]!r}"
        found.append(int(matched.group(1)))
        rest = rest[head_end + 4 + int(length.group(1)) :]
    return found


def violations(data: bytes, outcome: Outcome, *, built: list[bytes] | None = None) -> list[str]:
    """What in ``outcome`` breaks the module's rules, for the input ``data`` (``built``: the
    requests :func:`messages` made of which it is made, not mutated)."""
    found = [f"escaped: {e}" for e in outcome.errors]
    starts = len(re.findall(rb"[A-Z]+ ", data))  # at most this many requests begin in it
    if len(outcome.handed) > starts:
        found.append(f"{len(outcome.handed)} requests handed on from {starts} request lines")
    if built is not None:
        written = [part.split(b" ", 2)[1].decode() for part in built]
        targets = [h.target for h in outcome.handed]
        if targets != written[: len(targets)]:
            found.append(f"requests {targets} handed on, not those written: {written}")
    for handed in outcome.handed:
        hosts = [v for n, v in handed.headers if n.lower() == "host"]
        if handed.method == "CONNECT":
            found.append("CONNECT handed on")
        if not handed.target.startswith("/") or "#" in handed.target:
            found.append(f"target {handed.target!r} handed on")
        if handed.version not in ((1, 0), (1, 1)) or len(hosts) > 1:
            found.append(f"version {handed.version} with {len(hosts)} Host fields handed on")
        if handed.version == (1, 1) and not hosts:
            found.append("an HTTP/1.1 request without Host handed on")
        for name, value in handed.headers:
            if any(c in name + value for c in "\r\n\x00"):
                found.append(f"a field with CR, LF or NUL handed on: {name!r}")
            if built is not None and name.lower().startswith("x-trailer-"):
                found.append(f"a trailer or body field in a head: {name!r}: {value!r}")
        if built is not None and handed.target == "/hidden":
            found.append("a request hidden in a body handed on")
    answers = statuses(outcome.written)
    if isinstance(answers, str):
        found.append(answers)
    elif any(status >= 500 and status not in (501, 505) for status in answers):
        found.append(f"a server error: {answers}")
    return found


def check_built(parts: list[bytes], at: list[int]) -> None:
    """The rules for requests as :data:`messages` builds them, cut into reads at ``at``
    (``AssertionError`` naming the input and what broke)."""
    data = b"".join(parts)
    whole = serve([data])
    found = violations(data, whole, built=parts)
    assert found == [], (data, found)
    assert serve(cut(data, at)).comparable() == whole.comparable(), (data, at)


def check_mutated(raw: bytes, at: list[int]) -> None:
    """The rules for any bytes (mutated ones), cut into reads at ``at``."""
    whole = serve([raw])
    found = violations(raw, whole)
    assert found == [], (raw, found)
    assert serve(cut(raw, at)).comparable() == whole.comparable(), (raw, at)
