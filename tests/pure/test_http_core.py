"""The proxy's HTTP/1.1 core (``proxy.http.core``) as a table: bytes in, events and commands out
(``proxy.http.events``). Each row is a scripted conversation, as mitmproxy's playbooks read:
what the client sends, when the handler's answer is written, and what the core says after each
step. Every row's input is also fed split at every byte boundary, and a byte at a time: the core
must say the same (a body's bytes may come in other pieces; they are joined to compare).

Then every request case of the framing battery (``bench/harness/framing_cases.py``) through the
core alone, carried out as the glue carries it out (``bench/harness/server_fuzz.py``): the
verdict the battery reads from the live proxy, each case's bytes cut at every byte boundary to
the same end, and nothing the client hid in a head.

The last tests show the table able to fail: a core that closes where it should linger, and one
that parses a read whole, each fail the rows that say otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import FrozenInstanceError, dataclass
from types import SimpleNamespace
from typing import cast

import pytest

import proxy.http.core as core_module
from bench.harness.framing_cases import REQUESTS, Case
from bench.harness.server_fuzz import Outcome, cut, serve, statuses
from proxy.errors import LocalProtocolError
from proxy.http.core import LINGER_S, PIPELINE, SLICE, HttpCore
from proxy.http.events import (
    CLOSE,
    END,
    PAUSE,
    RESUME,
    SERVE,
    BodyBroken,
    Command,
    Data,
    Event,
    Linger,
    Refused,
    RequestHead,
    Send,
    data,
    request_head,
)
from proxy.messages import ClientConnection, Request

LINGER = Linger(LINGER_S)
BROKEN = "the body broke off"  # BodyBroken, whatever its message
ANSWERED = "answered"  # the handler's answer is written; the connection is kept
CLOSING = "answered, closing"  # ... and the answer closes it


@dataclass(frozen=True)
class RefusedWith:
    """Refused, compared by its status (the message is llhttp's words)."""

    status: int


Step = bytes | str  # what the client sends, or ANSWERED / CLOSING
Said = Event | Command | RefusedWith | str


@dataclass(frozen=True)
class Row:
    name: str
    steps: tuple[tuple[Step, list[Said]], ...]
    max_header_size: int = 8190
    max_headers: int = 128
    cuts: bool = True  # the same whichever way the reads are cut (see the slicing row)


def _core(row: Row) -> HttpCore:
    return HttpCore(
        max_header_size=row.max_header_size,
        max_headers=row.max_headers,
        refusal_answer=lambda status, message: b"%d" % status,
        now=0.0,
    )


def _normal(said: Iterable[Event | Command]) -> list[Said]:
    out: list[Said] = []
    for item in said:
        if isinstance(item, Data) and out and isinstance(out[-1], Data):
            out[-1] = Data(out[-1].data + item.data)
        elif isinstance(item, Refused):
            out.append(RefusedWith(item.error.status))
        elif isinstance(item, BodyBroken):
            out.append(BROKEN)
        else:
            out.append(item)
    return out


def _play(row: Row, reads: Iterable[Iterable[bytes]]) -> list[list[Said]]:
    """What the core says after each step, each step's bytes fed as ``reads`` gives them."""
    core = _core(row)
    heard = []
    for (step, _), pieces in zip(row.steps, reads, strict=True):
        said: list[Event | Command] = []
        if step in (ANSWERED, CLOSING):
            said += core.answered(1.0, close=step == CLOSING)
        else:
            for piece in pieces:
                said += core.receive(piece, 1.0)
        heard.append(_normal(said))
    return heard


def head(
    target: str = "/c",
    *fields: tuple[str, str],
    method: str = "GET",
    version: tuple[int, int] = (1, 1),
    keep_alive: bool = True,
    host: str | None = "up",
) -> RequestHead:
    """The head the core makes of the request :func:`req` writes with the same arguments."""
    headers = [("Host", host)] if host is not None else []
    headers += fields
    length = next((int(v) for n, v in fields if n == "Content-Length"), None)
    chunked = any(n == "Transfer-Encoding" for n, _ in fields)
    return RequestHead(method, target, version, headers, keep_alive, length, chunked)


def req(
    target: str = "/c",
    *fields: tuple[str, str],
    method: str = "GET",
    version: tuple[int, int] = (1, 1),
    host: str | None = "up",
) -> bytes:
    lines = [f"{method} {target} HTTP/{version[0]}.{version[1]}"]
    lines += [f"Host: {host}"] if host is not None else []
    lines += [f"{n}: {v}" for n, v in fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


GET = req()
CL5 = ("Content-Length", "5")
TE = ("Transfer-Encoding", "chunked")
POST5 = head("/c", CL5, method="POST")
POSTC = head("/c", TE, method="POST")
REFUSED_400 = [RefusedWith(400), Send(b"400"), LINGER]


def _kib(n: int) -> tuple[bytes, RequestHead]:
    """Request ``/n`` padded to 1 KiB (four to a slice), and its head."""
    pad = ("X-Pad", "p" * (1024 - len(req(f"/{n}", ("X-Pad", "")))))
    return req(f"/{n}", pad), head(f"/{n}", pad)


KIB = [_kib(n) for n in range(30)]


def _heads(first: int, last: int) -> list[Said]:
    return [said for _, h in KIB[first : last + 1] for said in (h, END)]


def _sliced_pipeline() -> tuple[tuple[Step, list[Said]], ...]:
    """30 requests of 1 KiB in one read: parsed a slice (four) at a time until the pipeline is
    full, the rest held unparsed; each answer serves the next, and once fewer than 16 wait what
    is held is parsed, a slice at a time again; reading resumes when nothing is held and fewer
    than 16 wait."""
    read = b"".join(data for data, _ in KIB)
    first = [KIB[0][1], SERVE, END, *_heads(1, 15), KIB[16][1], PAUSE, END, *_heads(17, 19)]
    three: list[tuple[Step, list[Said]]] = [(ANSWERED, [SERVE])] * 3  # 18, 17, 16 wait
    return (
        (read, first),  # 0 served, 1-19 wait (the pause at 16), 20-29 held
        *three,
        (ANSWERED, [SERVE, *_heads(20, 23)]),  # 15 wait: a slice parsed, 19 wait, 6 held
        *three,
        (ANSWERED, [SERVE, *_heads(24, 27)]),  # 15, then 19 wait, 2 held
        *three,
        (ANSWERED, [SERVE, *_heads(28, 29)]),  # 15, then 17 wait, nothing held
        (ANSWERED, [SERVE]),  # 16 wait
        (ANSWERED, [SERVE, RESUME]),  # 15 wait: reading resumes
    )


ROWS = [
    Row("a GET: its head, served, its end; once answered, nothing more", (
        (GET, [head(), SERVE, END]),
        (ANSWERED, []),
    )),
    Row("a body by length", (
        (req("/c", CL5, method="POST") + b"hello", [POST5, SERVE, Data(b"hello"), END]),
    )),
    Row("a chunked body: its chunks as one Data, its trailer fields dropped", (
        (req("/c", TE, method="POST") + b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
         [POSTC, SERVE, Data(b"hello world"), END]),
    )),
    Row("a body that arrives after its head is served", (
        (req("/c", CL5, method="POST"), [POST5, SERVE]),
        (b"hel", [Data(b"hel")]),
        (b"lo", [Data(b"lo"), END]),
        (ANSWERED, []),
    )),
    Row("HTTP/1.0: no Host needed, not kept alive unless asked", (
        (req(version=(1, 0), host=None), [head(version=(1, 0), keep_alive=False, host=None),
                                          SERVE, END]),
        (CLOSING, [CLOSE]),
        (GET, []),
    )),
    Row("HTTP/1.0 with Connection: keep-alive", (
        (req("/c", ("Connection", "keep-alive"), version=(1, 0)),
         [head("/c", ("Connection", "keep-alive"), version=(1, 0)), SERVE, END]),
        (ANSWERED, []),
        (GET, [head(), SERVE, END]),
    )),
    Row("Connection: close: an answer that closes, nothing read after it", (
        (req("/c", ("Connection", "close")),
         [head("/c", ("Connection", "close"), keep_alive=False), SERVE, END]),
        (CLOSING, [CLOSE]),
        (GET, []),
    )),
    Row("pipelined requests are served one at a time, in order", (
        (GET + req("/d") + req("/e", CL5, method="POST") + b"hello",
         [head(), SERVE, END, head("/d"), END, head("/e", CL5, method="POST"), Data(b"hello"),
          END]),
        (ANSWERED, [SERVE]),
        (ANSWERED, [SERVE]),
        (ANSWERED, []),
    )),
    Row("a full pipeline pauses reading; one served resumes it", (
        (GET * (PIPELINE + 1),
         [head(), SERVE, END, *[head(), END] * (PIPELINE - 1), head(), PAUSE, END]),
        (GET, []),  # read before the pause took: held, parsed in its turn
        (ANSWERED, [SERVE, head(), END]),  # 16 waiting again: still paused
        (ANSWERED, [SERVE, RESUME]),
    )),
    Row("a read past a full pipeline is parsed a slice at a time, the rest held",
        _sliced_pipeline(), cuts=False),
    Row("a head refused with nothing served: its answer, then a lingering close", (
        (b"GET /c HTTP/1.1\r\nX\r\n\r\n", REFUSED_400),
        (GET, []),
    )),
    Row("a head refused behind the one served is answered in its turn", (
        (GET + b"GET /d HTTP/1.1\r\nX\r\n\r\n" + GET, [head(), SERVE, END]),
        (ANSWERED, REFUSED_400),
    )),
    Row("a body that breaks off is its reader's; once answered, a lingering close", (
        (req("/c", TE, method="POST") + b"5\r\nhello\r\nzz\r\n",
         [POSTC, SERVE, Data(b"hello"), BROKEN]),
        (ANSWERED, [LINGER]),
        (b"more", []),
    )),
    Row("a pipelined body that breaks off: served in its turn, then a lingering close", (
        (GET + req("/d", TE, method="POST") + b"zz\r\n",
         [head(), SERVE, END, head("/d", TE, method="POST"), BROKEN]),
        (ANSWERED, [SERVE]),
        (ANSWERED, [LINGER]),
    )),
    Row("answered before its body ended (413, 408): a lingering close, the rest dropped", (
        (req("/c", ("Content-Length", "10"), method="POST") + b"hello",
         [head("/c", ("Content-Length", "10"), method="POST"), SERVE, Data(b"hello")]),
        (ANSWERED, [LINGER]),
        (b"world", []),
    )),
    Row("an Upgrade: served, nothing after it parsed, closed once answered", (
        (req("/c", ("Upgrade", "websocket"), ("Connection", "upgrade")) + req("/d"),
         [head("/c", ("Upgrade", "websocket"), ("Connection", "upgrade"), keep_alive=False),
          SERVE, END]),
        (ANSWERED, [CLOSE]),
    )),
    Row("a request line over max_header_size: 414", (
        (req("/" + "a" * 40), [RefusedWith(414), Send(b"414"), LINGER]),
    ), max_header_size=32),
    Row("a field over max_header_size: 431", (
        (req("/c", ("X-Long", "a" * 40)), [RefusedWith(431), Send(b"431"), LINGER]),
    ), max_header_size=32),
    Row("more fields than max_headers: 431", (
        (req("/c", *[("X-F", "1")] * 3), [RefusedWith(431), Send(b"431"), LINGER]),
    ), max_headers=3),
    Row("trailer fields count against max_headers: past them, the body breaks off", (
        (req("/c", TE, method="POST") + b"0\r\nX-A: 1\r\nX-B: 1\r\n\r\n",
         [POSTC, SERVE, BROKEN]),
    ), max_headers=3),
    Row("CONNECT is refused", ((b"CONNECT up:443 HTTP/1.1\r\nHost: up\r\n\r\n", REFUSED_400),)),
    Row("an HTTP/1.1 request with no Host is refused", ((req(host=None), REFUSED_400),)),
    Row("HTTP/2.0: 505", (
        (b"GET /c HTTP/2.0\r\nHost: up\r\n\r\n", [RefusedWith(505), Send(b"505"), LINGER]),
    )),
    Row("a coding besides chunked: 501", (
        (req("/c", ("Transfer-Encoding", "gzip, chunked"), method="POST"),
         [RefusedWith(501), Send(b"501"), LINGER]),
    )),
    Row("an empty line before a request line is skipped", ((b"\r\n" + GET, [head(), SERVE, END]),)),
]  # fmt: skip


def _whole(row: Row) -> Iterator[list[bytes]]:
    return ([s] if isinstance(s, bytes) else [] for s, _ in row.steps)


def _expected(row: Row) -> list[list[Said]]:
    return [said for _, said in row.steps]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_core_says_what_the_table_says(row: Row) -> None:
    assert _play(row, _whole(row)) == _expected(row)


@pytest.mark.parametrize("row", [r for r in ROWS if r.cuts], ids=[r.name for r in ROWS if r.cuts])
def test_the_core_says_the_same_however_its_reads_are_cut(row: Row) -> None:
    for at, (step, _) in enumerate(row.steps):
        if not isinstance(step, bytes):
            continue
        for i in range(1, len(step)):
            reads = list(_whole(row))
            reads[at] = [step[:i], step[i:]]
            assert _play(row, reads) == _expected(row), (at, i)
    bytewise = (
        [s[i : i + 1] for i in range(len(s))] if isinstance(s, bytes) else [] for s, _ in row.steps
    )
    assert _play(row, bytewise) == _expected(row)


def test_the_sliced_row_reads_past_one_slice() -> None:
    read = _sliced_pipeline()[0][0]
    assert isinstance(read, bytes) and len(read) > 5 * SLICE


def test_an_answer_with_nothing_served_is_a_local_error() -> None:
    core = _core(ROWS[0])
    with pytest.raises(LocalProtocolError):
        core.answered(0.0, close=False)
    core.receive(GET, 0.0)
    core.answered(0.0, close=False)
    with pytest.raises(LocalProtocolError):
        core.answered(0.0, close=False)


def test_reading_pauses_once_for_bodies_and_the_pipeline_and_resumes_when_both_let_go() -> None:
    core = _core(ROWS[0])
    assert core.receive(GET, 0.0) == [head(), SERVE, END]
    assert core.pause() is True  # a body holds too much: the transport pauses
    assert core.pause() is False  # a second body: already paused
    said = core.receive(GET * PIPELINE, 0.0)  # the pipeline fills: already paused
    assert PAUSE not in said and said.count(END) == PIPELINE
    assert core.resume() is False and core.resume() is False  # the pipeline still holds it
    assert core.receive(GET, 0.0) == []  # read on before the pause took: held
    assert core.answered(0.0, close=False) == [SERVE, head(), END]  # parsed: 16 wait again
    assert core.answered(0.0, close=False) == [SERVE, RESUME]


def test_lingering_resumes_reading_for_good() -> None:
    core = _core(ROWS[0])
    core.receive(req("/c", ("Content-Length", "9"), method="POST") + b"hello", 0.0)
    assert core.pause() is True
    assert core.answered(0.0, close=False) == [RESUME, LINGER]
    assert core.resume() is False and core.pause() is False


def test_the_clocks_run_only_while_no_request_is_served() -> None:
    """The head's clock runs from its first byte, the idle clock from the last head or answer;
    neither while a request is served; neither once the connection lingers."""
    core = _core(ROWS[0])
    header, idle = 30.0, 75.0
    assert core.expired(75.0, header, idle) is None
    assert core.expired(75.1, header, idle) == "idle_timeout"
    core.receive(b"GET /c HTTP/1.1\r\n", 100.0)  # a head begins
    assert core.expired(130.0, header, idle) is None
    assert core.expired(130.1, header, idle) == "header_timeout"
    assert core.expired(130.1, 0.0, idle) is None  # no header limit
    core.receive(b"Host: up\r\n\r\n", 120.0)  # complete: served
    assert core.expired(1000.0, header, idle) is None  # served: no clock runs
    core.answered(1010.0, close=False)
    assert core.expired(1085.0, header, idle) is None
    assert core.expired(1085.1, header, idle) == "idle_timeout"
    core.receive(b"GET /c HTTP/1.1\r\nX\r\n\r\n", 1090.0)  # refused: lingers
    assert core.expired(5000.0, header, idle) is None


def _verdict(case: Case, outcome: Outcome) -> str:
    """The battery's verdict read from what the core's glue wrote: ``relay`` where the request
    was handed on and its body ended (the harness answers 200), the status of any other
    answer, ``close`` where the connection ended with no answer, ``wait`` where it waits."""
    answered = statuses(outcome.written)
    assert isinstance(answered, list), answered
    words = []
    for i, target in enumerate(case.targets):
        if i < len(answered):
            handed = i < len(outcome.handed) and outcome.handed[i].target == target.decode()
            words.append("relay" if handed and answered[i] == 200 else str(answered[i]))
        else:
            words.append("close" if outcome.closed or outcome.lingered else "wait")
    return ",".join(words)


# Where the battery's verdict is the relay's, not the server's: the server hands the request on.
_THE_RELAYS = {"expect-unknown": "relay"}  # Expect other than 100-continue: the relay's 417


@pytest.mark.parametrize("case", REQUESTS, ids=[c.name for c in REQUESTS])
def test_every_battery_case_gets_the_battery_verdict_from_the_core(case: Case) -> None:
    outcome = serve(list(case.writes), max_headers=128)
    assert outcome.errors == []
    assert _verdict(case, outcome) == _THE_RELAYS.get(case.name, case.hangup)
    for handed in outcome.handed:
        assert "smuggled" not in handed.target.lower()
        for name, value in handed.headers:
            assert "smuggled" not in name.lower()
            assert not case.hides_values or "smuggled" not in value.lower()


@pytest.mark.parametrize("case", REQUESTS, ids=[c.name for c in REQUESTS])
def test_every_battery_case_reads_the_same_cut_at_every_byte(case: Case) -> None:
    data = b"".join(case.writes)
    whole = serve(list(case.writes), max_headers=128).comparable()
    for i in range(1, len(data)):
        assert serve(cut(data, [i]), max_headers=128).comparable() == whole, i


def _failing(rows: list[Row]) -> set[str]:
    return {row.name for row in rows if _play(row, _whole(row)) != _expected(row)}


def test_the_table_catches_a_core_that_closes_where_it_should_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows are not vacuous: a core that closes at once where it should linger (a reset
    that can destroy the answer before the client reads it) fails every row that lingers."""
    monkeypatch.setattr(HttpCore, "_linger", lambda self, out: out.append(CLOSE))
    lingering = {row.name for row in ROWS if any(LINGER in said for _, said in row.steps)}
    assert len(lingering) > 10
    assert _failing(ROWS) == lingering


def test_the_table_catches_a_core_that_parses_a_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """... and a core that parses a read whole (as before the slices) fails the sliced row."""
    monkeypatch.setattr(core_module, "SLICE", 1 << 30)
    assert _failing(ROWS) == {
        "a read past a full pipeline is parsed a slice at a time, the rest held"
    }


def test_the_core_makes_its_events_as_their_classes_do() -> None:
    """``request_head`` and ``data`` (the core's fast way to make them) make what
    ``RequestHead(...)`` and the frozen dataclass ``Data`` make: every field, equal, frozen."""
    values = ("GET", "/c", (1, 1), [("Host", "up")], True, None, False)
    made = request_head(values)
    assert type(made) is RequestHead and tuple(made) == values
    assert made == RequestHead(*values) and repr(made) == repr(RequestHead(*values))
    assert data(b"x") == Data(b"x") and repr(data(b"x")) == repr(Data(b"x"))
    with pytest.raises(AttributeError):
        made.method = "POST"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        data(b"x").data = b"y"  # type: ignore[misc]


def test_the_glue_makes_a_request_from_its_head_field_for_field() -> None:
    """``Request(connection, *head)`` (the glue's way): each of the head's fields where the
    request keeps it, whatever the order of either's fields."""
    head = RequestHead("POST", "/c?q", (1, 0), [("Host", "up")], False, 5, True)
    connection = cast(ClientConnection, SimpleNamespace(remote="10.0.0.1"))
    request = Request(connection, *head)
    kept = (request.method, request.raw_path, request.version, request.headers,
            request.keep_alive, request.content_length, request.chunked)  # fmt: skip
    assert kept == tuple(head) and request.headers is head.headers
