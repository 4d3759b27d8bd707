"""``proxy.http.head_rules.refusal``, case by case: what a request head that llhttp accepts is
refused with (or None: served). Each rule of the module's docstring has rows on both sides of
it, and the order of the rules (the first that applies answers) has rows of its own."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from proxy.http.head_rules import refusal


class Head(NamedTuple):
    method: bytes = b"GET"
    target: bytes = b"/c"
    version: str = "1.1"
    hosts: tuple[bytes, ...] = (b"up",)
    codings: tuple[bytes, ...] = ()


# (what the head is, the head, the status it is refused with or None, words of the message)
TABLE: list[tuple[str, Head, int | None, str]] = [
    ("a plain GET", Head(), None, ""),
    ("a POST with chunks", Head(b"POST", codings=(b"chunked",)), None, ""),
    # versions
    ("HTTP/1.0", Head(version="1.0"), None, ""),
    ("HTTP/0.9 (a bare GET /)", Head(version="0.9"), 505, "HTTP version 0.9"),
    ("HTTP/2.0", Head(version="2.0"), 505, "HTTP/1.1 or HTTP/1.0"),
    # methods
    ("CONNECT", Head(b"CONNECT", b"up:443"), 400, "CONNECT is not supported"),
    ("CONNECT with a path", Head(b"CONNECT", b"/c"), 400, "not tunnels"),
    ("an unusual method", Head(b"QUERY"), None, ""),
    # targets
    ("a path and a query", Head(target=b"/v1/completions?x=1&y=%2F"), None, ""),
    ("the root", Head(target=b"/"), None, ""),
    ("absolute-form", Head(target=b"http://up/c"), 400, "not a path (origin-form): 'http://"),
    ("asterisk-form", Head(b"OPTIONS", b"*"), 400, "not a path"),
    ("authority-form", Head(target=b"up:443"), 400, "not a path"),
    ("a fragment", Head(target=b"/c#frag"), 400, "carries a fragment: '/c#frag'"),
    ("a fragment after a query", Head(target=b"/c?q=1#f"), 400, "fragment"),
    ("a long target is quoted short", Head(target=b"x" * 500), 400, "'" + "x" * 100 + "'"),
    # Host
    ("no Host on HTTP/1.1", Head(hosts=()), 400, "no Host header field"),
    ("no Host on HTTP/1.0", Head(version="1.0", hosts=()), None, ""),
    ("two Hosts", Head(hosts=(b"up", b"up")), 400, "2 Host header fields"),
    ("two Hosts on HTTP/1.0", Head(version="1.0", hosts=(b"up", b"x")), 400, "2 Host"),
    ("an empty Host", Head(hosts=(b"",)), None, ""),
    ("a Host with a port", Head(hosts=(b"up:8080",)), None, ""),
    ("a Host with an empty port", Head(hosts=(b"up:",)), None, ""),
    ("an IPv4 Host", Head(hosts=(b"127.0.0.1:80",)), None, ""),
    ("an IPv6 Host", Head(hosts=(b"[::1]:80",)), None, ""),
    ("a Host in padding", Head(hosts=(b" up\t",)), None, ""),
    ("a sub-delims and percent Host", Head(hosts=(b"a-b.c_d~!$&'()*+,;=%20",)), None, ""),
    ("a Host with a space", Head(hosts=(b"up other",)), 400, "not host[:port]: 'up other'"),
    ("a Host with userinfo", Head(hosts=(b"user@up",)), 400, "not host[:port]"),
    ("a Host with a path", Head(hosts=(b"up/x",)), 400, "not host[:port]"),
    ("a Host with a port that is not digits", Head(hosts=(b"up:80a",)), 400, "host[:port]"),
    ("a Host with two ports", Head(hosts=(b"up:80:81",)), 400, "host[:port]"),
    ("an IPv6 Host unclosed", Head(hosts=(b"[::1",)), 400, "host[:port]"),
    ("an IPv6 Host with a zone", Head(hosts=(b"[fe80::1%eth0]",)), 400, "host[:port]"),
    # transfer codings
    ("chunked in capitals", Head(b"POST", codings=(b"CHUNKED",)), None, ""),
    ("chunked in padding", Head(b"POST", codings=(b" chunked ",)), None, ""),
    ("gzip, chunked", Head(b"POST", codings=(b"gzip, chunked",)), 501, "'gzip, chunked'"),
    ("two fields", Head(b"POST", codings=(b"gzip", b"chunked")), 501, "'gzip, chunked'"),
    ("chunked twice", Head(b"POST", codings=(b"chunked", b"chunked")), 501, "only chunked"),
    ("chunked on HTTP/1.0", Head(b"POST", version="1.0", codings=(b"chunked",)), 400, "faulty"),
    # the first rule that applies answers
    ("a bad version before CONNECT", Head(b"CONNECT", b"up:443", "2.0"), 505, "version"),
    ("CONNECT before its target", Head(b"CONNECT", b"up:443", hosts=()), 400, "CONNECT"),
    ("the target before Host", Head(target=b"*", hosts=()), 400, "not a path"),
    ("Host before the codings", Head(hosts=(), codings=(b"gzip",)), 400, "no Host"),
]


@pytest.mark.parametrize(("what", "head", "status", "words"), TABLE, ids=[t[0] for t in TABLE])
def test_refusal(what: str, head: Head, status: int | None, words: str) -> None:
    refused = refusal(head.method, head.target, head.version, list(head.hosts), list(head.codings))
    if status is None:
        assert refused is None
        return
    assert refused is not None
    assert refused.status == status
    assert words in refused.message
