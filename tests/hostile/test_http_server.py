"""Hostile input for the proxy's HTTP/1.1 server. Its core (``proxy.http.core``: llhttp, the
core's callbacks, ``proxy.http.head_rules``), with no I/O, fed anything a client can send up to
the limits (``--max-header-bytes`` 8190 bytes a line or field, ``--max-headers`` 128): each read
is parsed within the hostile tier's CPU budget (``bench.harness.hostile.Budget``: 20 ms per MiB +
10 ms), and what it says is a request or a refusal with its 4xx (501, 505): never an exception,
never a 5xx of its own.

Then the server on a socket (``proxy.http.server``, in this process): one read of 256 KiB of
small pipelined requests behind one being served. Parsed whole, as before the core parsed its
reads a slice at a time, that read became 9,708 requests waiting in memory (12 MB: 46 bytes for
each byte read, per connection, up to ``--max-connections``); now the pipeline and a slice of
them, the rest waiting as the bytes they came as, and every one answered in order once served.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import MIB, Budget, timed
from hangup_contract.runtime.connections import ConnectionLimits
from proxy.http.core import PIPELINE, SLICE, HttpCore
from proxy.http.events import Command, Event, Refused, RequestHead
from proxy.http.server import HttpServer
from proxy.messages import Answer, Request, error_answer

BUDGET = Budget()
EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LINE = 8190  # the default --max-header-bytes
FIELDS = 128  # the default --max-headers
READ = 256 * 1024  # what one read of the event loop's transport brings at most


def _core() -> HttpCore:
    return HttpCore(
        max_header_size=LINE,
        max_headers=FIELDS,
        refusal_answer=lambda status, message: b"%d" % status,
        now=0.0,
    )


def _fed(data: bytes) -> list[Event | Command]:
    core = _core()
    said: list[Event | Command] = []
    for start in range(0, len(data), READ):
        said += core.receive(data[start : start + READ], 0.0)
    return said


def _check(what: str, data: bytes) -> list[Event | Command]:
    outcome = timed(_fed, data)
    assert outcome.error is None, outcome.error
    BUDGET.check(what, len(data), outcome.spent)
    said: list[Event | Command] = outcome.result
    for item in said:
        if isinstance(item, Refused):
            assert 400 <= item.error.status < 500 or item.error.status in (501, 505), item
    return said


_runs = st.tuples(
    st.sampled_from([b"a", b"%", b"[", b":", b"0", b" ", b"\t", b"\xff", b";", b"=", b'"', b"\\"]),
    st.integers(1, LINE),
).map(lambda run: run[0] * run[1])
_names = st.one_of(st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding"]), _runs)
_fields = st.lists(st.tuples(_names, _runs), max_size=FIELDS + 2)


@st.composite
def _heads(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"CONNECT", b"PRI"]))
    target = b"/" + draw(_runs)[: LINE - 1]
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b""]))
    lines = [method + b" " + target + (b" " + version if version else b"")]
    lines += [name + b": " + value for name, value in draw(_fields)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + draw(st.binary(max_size=64))


@EXAMPLES
@given(data=_heads())
def test_any_head_up_to_the_limits_is_read_or_refused_within_budget(data: bytes) -> None:
    _check("a hostile head", data)


@EXAMPLES
@given(data=st.binary(max_size=64 * 1024))
def test_any_bytes_are_read_or_refused_within_budget(data: bytes) -> None:
    _check("random bytes", data)


def _get(fields: list[bytes]) -> bytes:
    return b"GET /c HTTP/1.1\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


_CHUNKED = b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
WORST = {
    "every field at the limit": _get([b"Host: a"] + [b"X: " + b"a" * (LINE - 1)] * (FIELDS - 1)),
    "every field tiny": _get([b"Host: a"] + [b"X: a"] * (FIELDS - 1)),
    "a Host of brackets": _get([b"Host: " + b"[" * (LINE - 4)]),
    "a Host of a port that is not one": _get([b"Host: :" + b"1" * (LINE - 6) + b"x"]),
    "a Host that almost matches": _get([b"Host: " + b"a" * (LINE - 5) + b"@"]),
    "an IPv6 Host that never closes": _get([b"Host: [" + b":" * (LINE - 5)]),
    "a target of escapes": b"GET /" + b"%" * (LINE - 1) + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    "a body of 1-byte chunks": _CHUNKED + b"1\r\nx\r\n" * (MIB // 6) + b"0\r\n\r\n",
    "a chunk extension of a MiB": _CHUNKED + b"1;" + b"a" * MIB + b"\r\nx\r\n0\r\n\r\n",
    "trailers at the limit": _CHUNKED + b"0\r\n" + b"X: a\r\n" * (FIELDS - 2) + b"\r\n",
    "a read of small requests": _get([b"Host: a"]) * (READ // len(_get([b"Host: a"]))),
}


@pytest.mark.parametrize("what", list(WORST))
def test_the_worst_inputs_at_the_limits(what: str) -> None:
    _check(what, WORST[what])


SMALL = _get([b"Host: a"])  # 27 bytes
AT_MOST = 1 + PIPELINE + SLICE // len(SMALL) + 1  # served, waiting, and one slice's worth


def test_a_read_of_small_requests_parses_the_pipeline_and_a_slice_at_most() -> None:
    said = _check("a read of small requests", WORST["a read of small requests"])
    assert sum(isinstance(item, RequestHead) for item in said) <= AT_MOST


class _Held:
    """A handler that holds the first request until released, and answers the rest at once."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.release = asyncio.Event()
        self.served = 0

    async def __call__(self, request: Request) -> Answer:
        self.served += 1
        if not self.first.is_set():
            self.first.set()
            await self.release.wait()
        return Answer(200, b"%d" % self.served)


def _server(handler: _Held) -> HttpServer:
    limits = ConnectionLimits(header_timeout=30, idle_timeout=75, max_connections=0)
    return HttpServer(
        handler, on_lost=lambda _: None, error=error_answer, limits=limits,
        on_close=lambda _: None, listener="http", max_header_size=LINE, max_headers=FIELDS,
    )  # fmt: skip


def _filled(data: bytes) -> tuple[socket.socket, socket.socket]:
    """A connection whose server side has ``data`` waiting in its receive buffer, unread: the
    server's first read takes as much as one read takes."""
    with socket.socket() as listening:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * len(data))  # before listen
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        client = socket.create_connection(listening.getsockname()[:2], timeout=10)
        accepted, _ = listening.accept()
    client.sendall(data)
    client.setblocking(False)
    return client, accepted


async def test_a_read_of_pipelined_requests_waits_as_bytes_not_as_requests() -> None:
    handler = _Held()
    server = _server(handler)
    data = SMALL * (READ // len(SMALL))
    client, accepted = _filled(data)
    loop = asyncio.get_running_loop()
    gc.collect()
    tracemalloc.start()
    try:
        transport, _ = await loop.connect_accepted_socket(server, accepted)
        await asyncio.wait_for(handler.first.wait(), 10)  # the read is parsed, reading paused
        grew = tracemalloc.get_traced_memory()[0]
        waiting = sum(type(o) is Request for o in gc.get_objects())
    finally:
        tracemalloc.stop()
    reader, writer = await asyncio.open_connection(sock=client)
    try:
        assert waiting <= AT_MOST, f"{waiting} requests parsed from one read"
        assert grew < 2 * MIB, f"{grew / MIB:.1f} MiB held for one read of 256 KiB"
        handler.release.set()
        answers = (await asyncio.wait_for(reader.readexactly(_answered(data)), 30)).split(
            b"HTTP/1.1 200 OK"
        )[1:]
        assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [
            b"%d" % n for n in range(1, len(data) // len(SMALL) + 1)
        ]
    finally:
        writer.close()
        transport.close()
        await server.shutdown(0)


def _answered(data: bytes) -> int:
    """The bytes of the answers to ``data``'s requests, each ``Answer(200, b"<n>")``."""
    one = Answer(200, b"1").encode("GET", (1, 1), True)[0]
    return sum(len(one) + len(str(n)) - 1 for n in range(1, len(data) // len(SMALL) + 1))
