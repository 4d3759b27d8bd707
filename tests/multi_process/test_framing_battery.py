"""The differential framing battery (``bench/harness/framing_battery.py``, issue 48): 121 raw
requests (CL/TE conflicts and obfuscations, chunk syntax, trailers, header syntax, request-line
forms, Host, Expect, pipelining, HTTP/1.0, limits) through hangup's proxy and through Envoy, each
to an upstream that logs every byte and reads it with h11; the same requests straight at the
gateway and at the proxy's admin listener; 24 broken or hostile upstream answers through the
proxy and Envoy. Deliberately naive relays (``bench/harness/naive_relay.py``) take the same cases,
and each rule of the battery is shown to fire on them: its silence about the proxy means
something only because it is not silent about them.

Everything runs once (about 40 s); each test reads one part of what was seen.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.base.addresses import host_port, port_of
from bench.base.processes import spawn
from bench.harness.envoy import running_envoy
from bench.harness.framing_battery import Result, differences_table
from bench.harness.framing_cases import REQUESTS, RESPONSES, Case, ResponseCase
from bench.harness.framing_stack import Seen, run_battery
from bench.harness.recording_upstream import RecordingUpstream

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "proxy.md"


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    yield asyncio.run(run_battery(tmp_path_factory.mktemp("framing")))


def _findings(results: list[Result]) -> list[tuple[str, list[str]]]:
    return [(r.name, r.findings) for r in results if r.findings]


def test_the_battery_sees_a_naive_relay_smuggle_a_request_on_cl_te(seen: Seen) -> None:
    """The self-test: a relay that frames by Content-Length alone forwards CL+TE as it came,
    and the upstream, reading Transfer-Encoding first as RFC 9112 says, reads the hidden
    request. If the battery could not see this, its silence about the others would mean
    nothing."""
    naive = {r.name: r for r in seen.requests["naive"]}
    findings = " ".join(naive["cl-te"].findings)
    assert "the upstream read a request the client hid: GET b'/smuggled'" in findings
    assert "a head framed two ways reached the upstream" in findings
    assert "a head framed two ways" in " ".join(naive["te-cl"].findings)


# Each rule of the battery on requests, and a case on which a naive relay breaks it. Two rules
# cannot fire behind h11, which refuses such a head before it is a request (it shows as "could not
# read" instead): two Host fields, a bare CR or LF. None of the naive relays moves a trailer or a
# folded line's value into a head, so "hidden fields" is shown by the fuzz's mutation instead
# (tests/pure/test_http_server_fuzz.py).
REQUEST_RULES = {
    "the upstream read a request the client hid": ("naive", "cl-te"),
    "a head framed two ways reached the upstream": ("naive", "te-cl"),
    "a folded line reached the upstream": ("naive", "header-obs-fold"),
    "the upstream read 2 requests": ("naive", "cl-te"),
    "the upstream could not read what the relay sent": ("naive", "host-twice-differ"),
    "answer 1 is the upstream's answer to b'http://up/c'": ("naive", "absolute-form"),
    "2 answers to 1 requests": ("naive", "pri-preface"),
    "a half-sent request was left on an open upstream connection": ("naive", "te-cl"),
    "the next call got 400 None, not its own answer": ("naive-reusing", "chunk-last-missing"),
    "the upstream read [] for one probe": ("naive-reusing", "chunk-last-missing"),
}
RESPONSE_RULES = {
    "the client got what the upstream wrote past its answer": "resp-extra-after-length",
    "answer 2 is the upstream's answer to b'/smuggled'": "resp-204-with-body",
    "2 answers to 1 requests": "resp-101",
    "a malformed answer: an answer framed ambiguously": "resp-cl-te",
}


def _fired(results: list[Result], case: str) -> str:
    return " ".join(next(r for r in results if r.name == case).findings)


@pytest.mark.parametrize("rule", REQUEST_RULES)
def test_each_rule_on_requests_fires_on_a_naive_relay(seen: Seen, rule: str) -> None:
    target, case = REQUEST_RULES[rule]
    assert rule in _fired(seen.requests[target], case)


@pytest.mark.parametrize("rule", RESPONSE_RULES)
def test_each_rule_on_answers_fires_on_a_relay_that_reuses_its_upstream_connection(
    seen: Seen, rule: str
) -> None:
    """The naive relay that keeps its upstream connection and copies what comes on it: what the
    upstream wrote past its answer reaches the client (its head at least: the answer behind
    claims a body nothing sends, and the battery reads the head all the same)."""
    assert rule in _fired(seen.responses["naive"], RESPONSE_RULES[rule])


def test_the_naive_relay_takes_every_case_and_is_caught_on_each_the_proxy_refuses(
    seen: Seen,
) -> None:
    """Every request case through the naive relay: each case the proxy refuses for what it
    hides (it names ``smuggled``) is one the battery catches the naive relay on, or one the
    upstream refused too (what the relay let through then reached nothing)."""
    naive = {r.name: r for r in seen.requests["naive"]}
    assert set(naive) == {c.name for c in REQUESTS}
    hiding = [c for c in REQUESTS if b"smuggled" in b"".join(c.writes).lower()
              and not c.hangup.startswith("relay")]  # fmt: skip
    missed = [c.name for c in hiding if not naive[c.name].findings]
    assert missed == []


def test_nothing_the_proxy_relays_is_smuggled(seen: Seen) -> None:
    assert _findings(seen.requests["hangup"]) == []


def _unlike_their_case(
    cases: list[Case] | list[ResponseCase], results: list[Result]
) -> list[tuple[str, str, str]]:
    """(case, what it says hangup does, what hangup did) where the two differ."""
    return [
        (case.name, case.hangup, result.verdict)
        for case, result in zip(cases, results, strict=True)
        if result.verdict != case.hangup
    ]


def test_the_proxy_answers_each_request_as_specified(seen: Seen) -> None:
    """Each case's ``hangup`` word: relayed, or the status the proxy answered, per request."""
    assert _unlike_their_case(REQUESTS, seen.requests["hangup"]) == []


def test_envoy_the_reference_shows_no_smuggle_either(seen: Seen) -> None:
    """A finding through Envoy would more likely be the battery misreading than Envoy
    smuggling: it is checked so that the battery's rules stay honest."""
    assert _findings(seen.requests["envoy"]) == []
    assert _findings(seen.responses["envoy"]) == []


def test_the_gateway_and_the_admin_listener_stay_in_step(seen: Seen) -> None:
    """Servers with nothing behind them: no 5xx, a well-formed status line for every answer
    (aiohttp answered 'HTTP/2.0 404' to an HTTP/2.0 request line), never more answers than
    requests, and a fresh call answered after every case."""
    assert _findings(seen.requests["gateway"]) == []
    assert _findings(seen.requests["admin"]) == []


def test_upstream_answers_reach_the_client_framed_one_way_and_in_step(seen: Seen) -> None:
    """Bytes past an answer's end, trailers, two lengths, codings: the client gets one answer
    framed one way (or a 502, or a cut), and the next call gets its own."""
    assert _findings(seen.responses["hangup"]) == []
    assert _unlike_their_case(RESPONSES, seen.responses["hangup"]) == []


def test_docs_list_every_difference_from_envoy(seen: Seen) -> None:
    """docs/proxy.md's table is the battery's own: a row per case where the proxy and Envoy
    answer differently, no more, no fewer."""
    text = DOCS.read_text()
    table = text.split("<!-- framing-differences -->")[1]
    documented = {
        tuple(cell.strip().strip("`") for cell in row.split("|")[1:4])
        for row in table.splitlines()
        if re.match(r"\| `", row)
    }
    measured = {row[:3] for row in differences_table(seen.requests, seen.responses)}
    assert measured - documented == set(), "differences missing from docs/proxy.md"
    assert documented - measured == set(), "rows in docs/proxy.md no longer measured"


TRAILERED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer from-head\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
    b"Authorization: Bearer from-trailer\r\n\r\n"
)


async def _post(address: str) -> bytes:
    host, port = host_port(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(TRAILERED)
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


async def test_a_front_door_that_strips_a_header_and_forwards_trailers_cannot_get_it_upstream(
    tmp_path: Path,
) -> None:
    """Envoy configured as a front door that owns ``Authorization`` (stripped from every head)
    and forwards request trailers: straight to an upstream, the trailer's ``Authorization``
    arrives as a trailer (so the front door does let it through); with hangup's proxy between,
    it reaches the upstream nowhere (on 27a1715 it arrived in the head, 3 times of 3)."""
    calls = 20
    async with RecordingUpstream() as direct, RecordingUpstream() as behind:
        args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                "--cancel-adapter", "none", "--upstream-http", behind.url]  # fmt: skip
        with (
            spawn("proxy", args, tmp_path / "proxy") as proxy,
            running_envoy(direct.port, tmp_path / "direct", trailers=True,
                          strip_request_headers=["authorization"]) as plain,
            running_envoy(port_of(proxy.listeners["http"]), tmp_path / "front",
                          trailers=True, strip_request_headers=["authorization"]) as front,
        ):  # fmt: skip
            for _ in range(calls):
                assert (await _post(plain.address)).startswith(b"HTTP/1.1 200")
                assert (await _post(front.address)).startswith(b"HTTP/1.1 200")
    assert len(direct.log) == len(behind.log) == calls
    for parsed in direct.log:
        assert parsed.field_values(b"authorization") == []
        assert (b"authorization", b"Bearer from-trailer") in [
            (n.lower(), v) for n, v in parsed.trailers
        ]
    for parsed in behind.log:
        assert parsed.body == b"hello" and parsed.complete
        assert b"from-trailer" not in parsed.head and parsed.trailers == []
        assert parsed.field_values(b"authorization") == []
