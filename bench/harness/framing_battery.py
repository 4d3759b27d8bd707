"""The differential framing battery: raw requests (``framing_cases``) through a relay to an
upstream that logs every byte (``recording_upstream``), or straight at a server; what the client
got, what the upstream read, and every sign of a smuggle.

A relay is caught smuggling when, for one case:

- the upstream reads a request or a field the client hid (in a body, a trailer, a folded line,
  behind a ``Connection: close``): it names ``smuggled``;
- the upstream reads more requests than the client sent, or an answer the client gets is for
  another request than the one it answers (``X-Seen``), or more answers come than requests;
- a head reaches the upstream framed ambiguously (two lengths, a length and chunks, a coding
  besides chunked, a folded line, a bare CR or LF), or such an answer reaches the client;
- a request is left half-sent on an upstream connection that stays open after the client left,
  or the next call on a fresh connection (the probe) does not get its own answer.

A server with nothing behind it (the gateway, the admin listener) is held to what a client can
see: no 5xx, never more answers than requests, a probe answered after every case.

:func:`run_requests` and :func:`run_responses` return a :class:`Result` per case; each has its
``verdict`` (per request: ``relay``, the status the target answered, ``close`` or ``wait``) and
its ``findings``. :func:`differences` is the table of cases where two targets' verdicts differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.base.addresses import host_port
from bench.base.waiting import wait_until
from bench.harness.framing_cases import REQUESTS, RESPONSES, Case, ResponseCase
from bench.harness.raw_http import RawServer
from bench.harness.recording_upstream import SEEN, Parsed, RecordingUpstream

# The clocks only ever make a case wait for what does not come; none decides a verdict of a
# target that answers, however loaded the machine (a busy CI runner takes a second at times).
IDLE_S = 3.0  # no byte for this long: the target is waiting for more (verdict "wait")
GRACE_S = 0.05  # how long to look for an answer too many once every request has one
SETTLE_S = 10.0  # the time a relay has to end what its client left behind
PROBE_S = 10.0  # the time a fresh call has to get its answer
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


@dataclass
class Answer:
    status: int
    fields: list[tuple[bytes, bytes]]
    body: bytes
    cut: bool = False  # the connection ended before the body did (the honest end of a cut one)
    stalled: bool = False  # its head came, then its body stopped coming

    def field(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.fields if n.lower() == name), None)


@dataclass
class Target:
    """Where the battery's clients connect: a relay (in front of ``upstream``, when it is a
    recording one), whose upstream names what it read in ``X-Seen``; or a server, that answers
    ``probe`` with 200."""

    name: str
    address: str
    upstream: RecordingUpstream | None = None
    probe: bytes = b""
    settle_s: float = SETTLE_S  # the time it has to end what its client left behind


@dataclass
class Result:
    name: str
    targets: tuple[bytes, ...]
    answers: list[Answer]
    ended: str  # "closed" by the target, "open" (the client closed it), "waited" (no answer)
    upstream: list[Parsed] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        words = []
        for i, target in enumerate(self.targets):
            if i < len(self.answers):
                answer = self.answers[i]
                relayed = answer.field(SEEN) == target and answer.status == 200
                words.append("relay" if relayed else str(answer.status))
                words[-1] += " cut" if answer.cut else " stalled" if answer.stalled else ""
            else:
                words.append("close" if self.ended == "closed" else "wait")
        return ",".join(words)

    @property
    def outcome(self) -> str:
        """The verdict with every way of getting no whole answer (a cut, a close, a wait) as
        ``none``: when a relay that refused something closes is its own timing (Envoy waits up
        to a second for the client to close first), and the tables compare what is stable."""
        words = self.verdict.split(",")
        return ",".join("none" if w in ("close", "wait") or w.endswith((" cut", " stalled"))
                        else w for w in words)  # fmt: skip


class _Malformed(Exception):
    pass


async def _read_answer(reader: asyncio.StreamReader, within: float) -> Answer | None:
    """The next final answer (1xx skipped); None if the connection ended cleanly before one.
    ``TimeoutError`` if no head came for ``within`` s; ``_Malformed`` if it is not HTTP/1.1. A
    head whose body stops coming for ``within`` s is an answer still, ``stalled``: the client
    has read what it says (an answer the upstream wrote past the last one that claims a body
    nothing sends shows up so)."""
    while True:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise _Malformed(f"an answer cut in its head: {exc.partial[:80]!r}") from exc
            return None
        lines = head[:-4].split(b"\r\n")
        matched = _STATUS.fullmatch(lines[0])
        if matched is None:
            raise _Malformed(f"not a status line: {lines[0][:80]!r}")
        fields = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or name != name.strip() or b"\n" in line or b"\r" in line:
                raise _Malformed(f"not a header field: {line[:80]!r}")
            fields.append((name, value.strip(b" \t")))
        status = int(matched.group(1))
        if 100 <= status < 200 and status != 101:
            continue
        answer = Answer(status, fields, b"")
        lengths = [v for n, v in fields if n.lower() == b"content-length"]
        codings = [v for n, v in fields if n.lower() == b"transfer-encoding"]
        if len(lengths) > 1 or (lengths and codings) or codings not in ([], [b"chunked"]):
            raise _Malformed(f"an answer framed ambiguously: {lengths} {codings}")
        if status in (101, 204, 304):
            return answer
        try:
            if lengths:
                answer.body = await asyncio.wait_for(reader.readexactly(int(lengths[0])), within)
            elif codings:
                answer.body = await asyncio.wait_for(_chunks(reader), within)
            else:
                answer.body = await asyncio.wait_for(reader.read(), within)
        except (asyncio.IncompleteReadError, ConnectionError):
            answer.cut = True
        except TimeoutError:
            answer.stalled = True
        return answer


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"x", 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields
        pass
    return body


Between = Callable[[], Awaitable[None]]
"""Awaited between two writes of a case: until the target has read what came so far."""


async def _nothing() -> None:
    return None


async def _converse(
    address: str, writes: tuple[bytes, ...], expected: int, findings: list[str],
    idle: float = IDLE_S, between: Between = _nothing,
) -> tuple[list[Answer], str]:  # fmt: skip
    """Write ``writes`` (awaiting ``between`` between two), read every answer (until none
    comes for ``idle`` s, or ``GRACE_S`` once ``expected`` have come); then close."""
    host, port = host_port(address)
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    answers: list[Answer] = []
    ended = "open"
    try:
        for n, data in enumerate(writes):
            if n:
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                await between()  # the part that comes late comes in a read of its own
            writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        while True:
            within = GRACE_S if len(answers) >= expected else idle
            try:
                answer = await _read_answer(reader, within)
            except TimeoutError:
                ended = "open" if answers else "waited"
                break
            except (_Malformed, asyncio.IncompleteReadError, ValueError) as exc:
                findings.append(f"a malformed answer: {exc}")
                ended = "closed"
                break
            except ConnectionError:
                ended = "closed"
                break
            if answer is None:
                ended = "closed"
                break
            answers.append(answer)
            if answer.cut or answer.stalled:
                ended = "closed" if answer.cut else "open"
                break
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return answers, ended


def _head_findings(parsed: Parsed, case: Case) -> list[str]:
    """What is ambiguous or hidden in a head the upstream read for ``case``."""
    found = []
    shown = f"{parsed.method.decode()} {parsed.target[:60]!r}"
    if b"smuggled" in parsed.target.lower():
        found.append(f"the upstream read a request the client hid: {shown}")
    hidden = [
        (name, value[:60])
        for name, value in parsed.fields
        if b"smuggled" in name.lower() or (b"smuggled" in value.lower() and case.hides_values)
    ]
    if hidden:
        found.append(f"the upstream read {len(hidden)} hidden fields in {shown}: {hidden[:3]}")
    lines = parsed.head.split(b"\r\n")
    names = [line.partition(b":")[0].strip().lower() for line in lines[1:] if line]
    if names.count(b"content-length") > 1 or (
        b"content-length" in names and b"transfer-encoding" in names
    ):
        found.append(f"a head framed two ways reached the upstream: {shown}")
    if names.count(b"host") > 1:
        found.append(f"two Host fields reached the upstream: {shown}")
    if any(line[:1] in (b" ", b"\t") for line in lines[1:]):
        found.append(f"a folded line reached the upstream: {shown}")
    if any(b"\n" in line or b"\r" in line for line in lines):
        found.append(f"a bare CR or LF reached the upstream: {shown}")
    return found


def _answer_findings(result: Result) -> list[str]:
    found = []
    if len(result.answers) > len(result.targets):
        found.append(f"{len(result.answers)} answers to {len(result.targets)} requests")
    for i, answer in enumerate(result.answers):
        seen = answer.field(SEEN)
        if seen is not None and (i >= len(result.targets) or seen != result.targets[i]):
            found.append(f"answer {i + 1} is the upstream's answer to {seen!r}")
    return found


async def _probe(target: Target, n: int) -> str | None:
    """Why a fresh call through ``target`` did not get its own answer (None: it did)."""
    path = b"/probe/%d" % n
    request = target.probe or b"GET " + path + b" HTTP/1.1\r\nHost: up\r\n\r\n"
    findings: list[str] = []
    answers, _ = await _converse(target.address, (request,), 1, findings, PROBE_S)
    if findings or not answers:
        return f"the next call got no answer: {findings}"
    answer = answers[0]
    if answer.status != 200 or (not target.probe and answer.field(SEEN) != path):
        return f"the next call got {answer.status} {answer.field(SEEN)!r}, not its own answer"
    return None


async def _settled(upstream: RecordingUpstream, mark: list[int], within: float) -> bool:
    """Every upstream connection the case used closed or between requests, within ``within``
    s."""
    with contextlib.suppress(AssertionError):
        return await wait_until(
            lambda: upstream.at_rest_since(mark), within, "the upstream at rest"
        )
    return False


def _upstream_began(upstream: RecordingUpstream, mark: int) -> Between:
    """Until the upstream has begun reading a request of the case (the relay read its head and
    sent it on); a relay that holds a request whole is given ``IDLE_S``, then the case goes on."""

    async def began() -> None:
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: len(upstream.log) > mark, IDLE_S, "the head relayed")

    return began


async def run_case(target: Target, case: Case, n: int) -> Result:
    upstream = target.upstream
    mark = len(upstream.log) if upstream else 0
    used = upstream.mark() if upstream else []
    errors = len(upstream.errors()) if upstream else 0
    findings: list[str] = []
    # A server (nothing behind it) gets a case's writes back to back: nothing tells when it
    # has read the first.
    between = _upstream_began(upstream, mark) if upstream is not None else _nothing
    answers, ended = await _converse(
        target.address, case.writes, len(case.targets), findings, between=between
    )
    result = Result(case.name, case.targets, answers, ended, findings=findings)
    if upstream is None:
        failed = [a.status for a in answers if a.status >= 500 and a.status not in (501, 505)]
        result.findings += [f"a server error: {status}" for status in failed]
    else:
        if not await _settled(upstream, used, target.settle_s):
            result.findings.append("a half-sent request was left on an open upstream connection")
        result.upstream = upstream.log[mark:]
        for parsed in result.upstream:
            result.findings += _head_findings(parsed, case)
        complete = [p for p in result.upstream if p.complete]
        if len(complete) > len(case.targets):
            result.findings.append(f"the upstream read {len(complete)} requests")
        result.findings += [
            f"the upstream could not read what the relay sent: {e}"
            for e in upstream.errors()[errors:]
        ]
    result.findings += _answer_findings(result)
    after = len(upstream.log) if upstream else 0
    if (why := await _probe(target, n)) is not None:
        result.findings.append(why)
    if upstream is not None and len(upstream.log) != after + 1:
        extra = [p.target for p in upstream.log[after:]]
        result.findings.append(f"the upstream read {extra} for one probe")
    return result


async def run_requests(target: Target, cases: list[Case] = REQUESTS) -> list[Result]:
    return [await run_case(target, case, n) for n, case in enumerate(cases)]


async def run_requests_in_lanes(lanes: list[Target], cases: list[Case] = REQUESTS) -> list[Result]:
    """The cases shared out among ``lanes`` (relays alike, each before an upstream of its own),
    each lane taking its cases one at a time; the results in the cases' order."""

    async def lane(k: int) -> list[tuple[int, Result]]:
        mine = range(k, len(cases), len(lanes))
        return [(n, await run_case(lanes[k], cases[n], n)) for n in mine]

    done = await asyncio.gather(*(lane(k) for k in range(len(lanes))))
    return [result for _, result in sorted((p for run in done for p in run), key=lambda p: p[0])]


class ScriptedAnswers:
    """An upstream that answers ``GET /r/<name>`` with :data:`RESPONSES`' raw bytes (in one
    write), and any other request with 200 and ``X-Seen``; one connection serves request after
    request until a case closes it."""

    def __init__(self, cases: list[ResponseCase] = RESPONSES) -> None:
        self._cases = {b"/r/" + c.name.encode(): c for c in cases}
        self._server = RawServer(self._answer)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    async def __aenter__(self) -> ScriptedAnswers:
        await self._server.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.__aexit__(*exc)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1]
            case = self._cases.get(target)
            if case is None:
                writer.write(b"HTTP/1.1 200 OK\r\nX-Seen: %b\r\nContent-Length: 0\r\n\r\n" % target)
                continue
            writer.write(case.raw)
            if case.close:
                await writer.drain()
                return


async def run_response(target: Target, case: ResponseCase, n: int) -> Result:
    """``GET /r/<name>`` through the relay ``target`` (in front of :class:`ScriptedAnswers`),
    then a probe on a fresh connection: it must get its own answer."""
    path = b"/r/" + case.name.encode()
    findings: list[str] = []
    request = b"GET " + path + b" HTTP/1.1\r\nHost: up\r\n\r\n"
    answers, ended = await _converse(target.address, (request,), 1, findings)
    result = Result(case.name, (path,), answers, ended, findings=findings)
    result.findings += _answer_findings(result)
    for answer in answers:
        fields = b"".join(n + v for n, v in answer.fields)
        if b"smuggled" in answer.body.lower() or b"smuggled" in fields.lower():
            result.findings.append("the client got what the upstream wrote past its answer")
    for m in range(3):  # the relay may hold several idle connections: try to reuse each
        if (why := await _probe(target, n * 10 + m)) is not None:
            result.findings.append(why)
            break
    return result


async def run_responses(target: Target, cases: list[ResponseCase] = RESPONSES) -> list[Result]:
    return [await run_response(target, case, n) for n, case in enumerate(cases)]


def differences(
    results: dict[str, list[Result]], first: str, second: str
) -> list[tuple[str, str, str, str]]:
    """The cases where ``first`` and ``second`` differ (by :attr:`Result.outcome`): (case,
    first's outcome, second's, what ``first`` is: ``stricter`` where fewer requests or answers
    get through it, ``looser`` where more, else ``other answer``)."""
    rows = []
    for a, b in zip(results[first], results[second], strict=True):
        ours, theirs = a.outcome, b.outcome
        if ours == theirs:
            continue
        kind = "other answer"
        if _passed(ours) < _passed(theirs):
            kind = "stricter"
        elif _passed(ours) > _passed(theirs):
            kind = "looser"
        rows.append((a.name, ours, theirs, kind))
    return rows


def _passed(outcome: str) -> int:
    """How many of its requests got through: relayed, or answered 1xx-3xx by the upstream."""
    return sum(word == "relay" or word[:1] in "123" for word in outcome.split(","))


def differences_table(
    requests: dict[str, list[Result]], responses: dict[str, list[Result]]
) -> list[tuple[str, str, str, str, str]]:
    """Where hangup's proxy and Envoy differ, request cases then response cases: (case,
    hangup's verdict, Envoy's, what hangup is, why), for docs/proxy.md."""
    whys = {c.name: c.why for c in REQUESTS} | {c.name: c.why for c in RESPONSES}
    rows = []
    for results in (requests, responses):
        for name, ours, envoys, kind in differences(results, "hangup", "envoy"):
            rows.append((name, ours, envoys, kind, whys.get(name, "")))
    return rows
