"""The framing battery's raw requests and raw upstream answers (``framing_battery`` runs them).

Each :class:`Case` is the bytes one client writes on one connection (in one write, or several,
each once the upstream began reading the request: a trailer that comes late, a body that never
ends), the targets of the
requests it means to send in order, and what hangup's proxy must answer (``hangup``: one word
per intended request, ``relay`` when the upstream read it, else the status the proxy answered,
``close`` when the connection ended with no answer, ``wait`` when nothing came while the client
waited). Whatever a case hides (a request inside a body, a field in a trailer or in a folded
line) names ``smuggled``: the upstream must never read that word in a target or a head.

:data:`RESPONSES` are answers a broken or hostile upstream writes to ``GET /r/<name>``: the
client must get an answer framed one way, or a 502, or a close, and the next call must get its
own answer.
"""

from __future__ import annotations

from dataclasses import dataclass

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: up\r\n\r\n"
SMUGGLED_POST = b"POST /smuggled HTTP/1.1\r\nHost: up\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    writes: tuple[bytes, ...]  # written in turn, each once the last reached the upstream
    targets: tuple[bytes, ...]  # the requests the client means to send
    hangup: str  # what the proxy must do with each, comma-separated
    why: str = ""  # the point of the case, in the differences table

    @property
    def hides_values(self) -> bool:
        """What it hides is a field's value too (a trailer's): no upstream head may carry it."""
        return self.group == "trailers" or self.group == "limits"


def _head(
    first: bytes, fields: list[bytes], *, host: bytes | None = b"up", version: bytes = b"1.1"
) -> bytes:
    line = first + b" HTTP/" + version + b"\r\n" if version else first + b"\r\n"
    host_line = [b"Host: " + host] if host is not None else []
    return line + b"".join(f + b"\r\n" for f in [*host_line, *fields]) + b"\r\n"


def _post(fields: list[bytes], body: bytes = b"", *, version: bytes = b"1.1") -> bytes:
    return _head(b"POST /c", fields, version=version) + body


def _cl(body: bytes) -> bytes:
    return b"Content-Length: %d" % len(body)


def _chunked(*chunks: bytes, last: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + last


TE = b"Transfer-Encoding: chunked"
# Chunked, ending with a request the upstream reads if it believes the chunks; Content-Length
# covers it all (what a relay that reads only Content-Length forwards as one body).
_HIDDEN = b"0\r\n\r\n" + SMUGGLED
# The other way round: a Content-Length of 4 ends the body inside the chunks.
_TE_CL_BODY = b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED_POST), SMUGGLED_POST)


def _c(
    name: str, group: str, data: bytes | tuple[bytes, ...], hangup: str = "relay", why: str = "",
    *, targets: tuple[bytes, ...] = (b"/c",),
) -> Case:  # fmt: skip
    writes = data if isinstance(data, tuple) else (data,)
    return Case(name, group, writes, targets, hangup, why)


CL_TE = [
    _c("cl-te", "CL/TE", _post([_cl(_HIDDEN), TE], _HIDDEN), "400",
       "both: the classic CL.TE smuggle"),
    _c("te-cl", "CL/TE", _post([TE, b"Content-Length: 4"], _TE_CL_BODY), "400",
       "both, Transfer-Encoding first: TE.CL"),
    _c("te-space-before-colon", "CL/TE",
       _post([_cl(_HIDDEN), b"Transfer-Encoding : chunked"], _HIDDEN), "400"),
    _c("te-tab-value", "CL/TE", _post([_cl(_HIDDEN), b"Transfer-Encoding:\tchunked"], _HIDDEN),
       "400"),
    _c("te-xchunked", "CL/TE", _post([_cl(_HIDDEN), b"Transfer-Encoding: xchunked"], _HIDDEN),
       "400"),
    _c("te-chunked-identity", "CL/TE",
       _post([_cl(_HIDDEN), b"Transfer-Encoding: chunked, identity"], _HIDDEN), "400"),
    _c("te-identity-chunked", "CL/TE",
       _post([_cl(_HIDDEN), b"Transfer-Encoding: identity, chunked"], _HIDDEN), "400"),
    _c("te-two-fields", "CL/TE",
       _post([TE, b"Transfer-Encoding: identity"], _chunked(b"hello")), "400"),
    _c("te-obs-fold", "CL/TE",
       _post([_cl(_HIDDEN), b"Transfer-Encoding:\r\n chunked"], _HIDDEN), "400"),
    _c("te-upper-case", "CL/TE", _post([b"Transfer-Encoding: CHUNKED"], _chunked(b"hello"))),
    _c("te-quoted", "CL/TE", _post([_cl(_HIDDEN), b'Transfer-Encoding: "chunked"'], _HIDDEN),
       "400"),
    _c("te-leading-space-line", "CL/TE",
       _post([_cl(_HIDDEN), b" Transfer-Encoding: chunked"], _HIDDEN), "400"),
    _c("te-nul", "CL/TE", _post([_cl(_HIDDEN), b"Transfer-Encoding: chunked\x00"], _HIDDEN),
       "400"),
    _c("te-vertical-tab", "CL/TE",
       _post([_cl(_HIDDEN), b"Transfer-Encoding:\x0bchunked"], _HIDDEN), "400"),
    _c("te-gzip-chunked", "CL/TE",
       _post([b"Transfer-Encoding: gzip, chunked"], _chunked(b"hello")), "501",
       "a coding besides chunked: its body would reach the upstream still gzipped"),
    _c("te-http10", "CL/TE", _post([TE], _chunked(b"hello"), version=b"1.0"), "400",
       "HTTP/1.0 has no chunked encoding (RFC 9112 section 6.1: faulty framing)"),
    _c("cl-twice-same", "CL/TE", _post([b"Content-Length: 5"] * 2, b"hello"), "400",
       "RFC 9110 lets a recipient take two equal lengths as one"),
    _c("cl-twice-differ", "CL/TE",
       _post([b"Content-Length: 5", b"Content-Length: 6"], b"hello!"), "400"),
    _c("cl-list", "CL/TE", _post([b"Content-Length: 5, 5"], b"hello"), "400"),
    _c("cl-plus", "CL/TE", _post([b"Content-Length: +5"], b"hello"), "400"),
    _c("cl-negative", "CL/TE", _post([b"Content-Length: -1"], b"hello"), "400"),
    _c("cl-hex", "CL/TE", _post([b"Content-Length: 0x5"], b"hello"), "400"),
    _c("cl-inner-space", "CL/TE", _post([b"Content-Length: 5 5"], b"hello"), "400"),
    _c("cl-overflow", "CL/TE", _post([b"Content-Length: 99999999999999999999999"], b"hello"),
       "400"),
    _c("cl-leading-zeros", "CL/TE", _post([b"Content-Length: 005"], b"hello")),
    _c("cl-space-before-colon", "CL/TE", _post([b"Content-Length : 5"], b"hello"), "400"),
    _c("cl-on-get", "CL/TE", _head(b"GET /c", [b"Content-Length: 5"]) + b"hello"),
    _c("cl-covers-a-request", "CL/TE", _post([_cl(SMUGGLED)], SMUGGLED),
       why="a request inside a body is body"),
    _c("cl-too-short", "CL/TE", (_post([b"Content-Length: 10"], b"hello"),), "wait",
       why="a body that never ends: the upstream's connection must not be reused"),
]  # fmt: skip

CHUNKS = [
    _c("chunk-extension", "chunks", _post([TE], b"5;a=b\r\nhello\r\n0\r\n\r\n")),
    _c("chunk-extension-quoted", "chunks", _post([TE], b'5;a="b c"\r\nhello\r\n0\r\n\r\n')),
    _c("chunk-size-leading-zeros", "chunks", _post([TE], b"0005\r\nhello\r\n0\r\n\r\n")),
    _c("chunk-size-upper-hex", "chunks", _post([TE], b"A\r\nhellohello\r\n0\r\n\r\n")),
    _c("chunk-size-trailing-space", "chunks", _post([TE], b"5 \r\nhello\r\n0\r\n\r\n"), "400"),
    _c("chunk-size-0x", "chunks", _post([TE], b"0x5\r\nhello\r\n0\r\n\r\n"), "400"),
    _c("chunk-size-negative", "chunks", _post([TE], b"-5\r\nhello\r\n0\r\n\r\n"), "400"),
    _c("chunk-size-overflow", "chunks",
       _post([TE], b"10000000000000005\r\nhello\r\n0\r\n\r\n"), "400"),
    _c("chunk-data-longer", "chunks", _post([TE], b"3\r\nhello\r\n0\r\n\r\n"), "400",
       "data past the chunk's size: Envoy relays the first 3 bytes"),
    _c("chunk-no-crlf-after-data", "chunks", _post([TE], b"5\r\nhello0\r\n\r\n"), "400"),
    _c("chunk-bare-lf", "chunks", _post([TE], b"5\nhello\n0\n\n"), "400"),
    _c("chunk-bare-cr", "chunks", _post([TE], b"5\rhello\r0\r\r"), "400"),
    _c("chunk-last-missing", "chunks", (_post([TE], b"5\r\nhello\r\n"),), "wait"),
    _c("chunk-data-shorter", "chunks", (_post([TE], b"8\r\nhello"),), "wait"),
    _c("chunk-last-with-extension", "chunks", _post([TE], b"5\r\nhello\r\n0;x=y\r\n\r\n")),
    _c("chunk-carries-a-request", "chunks", _post([TE], _chunked(SMUGGLED)),
       why="a request inside a chunk is body"),
    _c("chunk-extension-smuggle", "chunks",
       _post([TE], b"5;x\nGET /smuggled HTTP/1.1\r\nhello\r\n0\r\n\r\n"), "400"),
    _c("chunk-many-small", "chunks", _post([TE], _chunked(*[b"x"] * 200))),
]  # fmt: skip

_AUTH = b"Authorization: Bearer smuggled-from-trailer"
TRAILERS = [
    _c("trailer-authorization", "trailers", _post([TE], _chunked(b"hello", last=b"0\r\n" + _AUTH
       + b"\r\n\r\n")), why="a trailer field is not a header field (RFC 9110 section 6.5.1)"),
    _c("trailer-host", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nHost: smuggled\r\n\r\n"))),
    _c("trailer-request-id", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nX-Request-Id: smuggled\r\n\r\n"))),
    _c("trailer-custom", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nX-Smuggled: 1\r\n\r\n"))),
    _c("trailer-content-length", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nContent-Length: 50\r\n\r\n")), "400"),
    _c("trailer-transfer-encoding", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nTransfer-Encoding: chunked\r\n\r\n")), "400"),
    _c("trailer-late", "trailers", (_post([TE], b"5\r\nhello\r\n0\r\n"), _AUTH + b"\r\n\r\n")),
    _c("trailer-obs-fold", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nX-A: 1\r\n X-Smuggled: 1\r\n\r\n")), "400"),
    _c("trailer-then-request", "trailers",
       _post([TE], _chunked(b"hello", last=b"0\r\nX-Smuggled: 1\r\n\r\n")) + _head(b"GET /d", []),
       "relay,relay", "a request after the trailer section is the next one",
       targets=(b"/c", b"/d")),
]  # fmt: skip

_GET = b"GET /c"
HEADERS = [
    _c("header-space-before-colon", "header syntax", _head(_GET, [b"X-Smuggled : 1"]), "400"),
    _c("header-no-colon", "header syntax", _head(_GET, [b"X-Smuggled"]), "400"),
    _c("header-obs-fold", "header syntax", _head(_GET, [b"X-A: 1", b" X-Smuggled: 1"]), "400",
       "obs-fold: Envoy unfolds it into the value, hangup refuses it (RFC 9112 allows both)"),
    _c("header-bare-lf", "header syntax",
       b"GET /c HTTP/1.1\nHost: up\nX-Lf: 1\n\n", "400"),
    _c("header-bare-cr", "header syntax", _head(_GET, [b"X-A: 1\rX-Smuggled: 1"]), "400"),
    _c("header-nul-in-value", "header syntax", _head(_GET, [b"X-A: a\x00smuggled"]), "400"),
    _c("header-empty-name", "header syntax", _head(_GET, [b": smuggled"]), "400"),
    _c("header-obs-text-value", "header syntax", _head(_GET, [b"X-A: caf\xc3\xa9"])),
    _c("header-name-not-a-token", "header syntax", _head(_GET, [b"X@Smuggled: 1"]), "400"),
    _c("header-ctl-in-name", "header syntax", _head(_GET, [b"X-\x01Smuggled: 1"]), "400"),
    _c("header-value-whitespace", "header syntax", _head(_GET, [b"X-A:   padded   "])),
    _c("header-del-in-value", "header syntax", _head(_GET, [b"X-A: a\x7fb"]), "400"),
    _c("connection-names-content-length", "header syntax",
       _post([b"Content-Length: 5", b"Connection: Content-Length"], b"hello"),
       why="a length a hop-by-hop field names is still the framing"),
    _c("connection-names-host", "header syntax", _head(_GET, [b"Connection: host"])),
    _c("upgrade-then-request", "header syntax",
       _head(_GET, [b"Upgrade: websocket", b"Connection: upgrade"]) + _head(b"GET /d", []),
       "relay,close", "an Upgrade the proxy does not make: it answers, then closes",
       targets=(b"/c", b"/d")),
    _c("upgrade-h2c", "header syntax",
       _head(_GET, [b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__", b"Connection: "
                    b"Upgrade, HTTP2-Settings"])),
]  # fmt: skip

LINES = [
    _c("absolute-form", "request line", _head(b"GET http://up/c", []), "400",
       "a sidecar relays paths"),
    _c("absolute-form-other-host", "request line", _head(b"GET http://elsewhere/c", []), "400"),
    _c("asterisk-form", "request line", _head(b"OPTIONS *", []), "400"),
    _c("authority-form-connect", "request line", _head(b"CONNECT up:443", []), "400",
       "the proxy does not tunnel"),
    _c("connect-path", "request line", _head(b"CONNECT /c", []) + _head(b"GET /d", []),
       "400,close", "relayed, its upstream connection went back to the pool (issue 48)",
       targets=(b"/c", b"/d")),
    _c("fragment", "request line", _head(b"GET /c#frag", []), "400",
       "a client never sends a fragment"),
    _c("lower-case-method", "request line", _head(b"get /c", []), "400"),
    _c("unknown-method", "request line", _head(b"FROB /c", []), "400",
       "llhttp knows a fixed list of methods"),
    _c("http09", "request line", b"GET /c\r\n\r\n", "505"),
    _c("http2-version", "request line", _head(_GET, [], version=b"2.0"), "505"),
    _c("http12-version", "request line", _head(_GET, [], version=b"1.2"), "400"),
    _c("double-space", "request line", b"GET  /c HTTP/1.1\r\nHost: up\r\n\r\n"),
    _c("tab-separator", "request line", b"GET\t/c HTTP/1.1\r\nHost: up\r\n\r\n", "400"),
    _c("space-in-target", "request line", b"GET /c x HTTP/1.1\r\nHost: up\r\n\r\n",
       "400"),
    _c("leading-crlf", "request line", b"\r\n" + _head(_GET, [])),
    _c("non-ascii-target", "request line", _head(b"GET /c\xff", []), "400"),
    _c("percent-target", "request line", _head(b"GET /c%20d?q=%2F", []),
       targets=(b"/c%20d?q=%2F",)),
    _c("pri-preface", "request line", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "400"),
    _c("trace", "request line", _head(b"TRACE /c", [])),
    _c("query-method", "request line", _head(b"QUERY /c", [])),
]  # fmt: skip

HOSTS = [
    _c("host-missing", "Host", _head(_GET, [], host=None), "400",
       "RFC 9112 section 3.2"),
    _c("host-twice-same", "Host", _head(_GET, [b"Host: up"]), "400"),
    _c("host-twice-differ", "Host", _head(_GET, [b"Host: other"]), "400"),
    _c("host-empty", "Host", _head(_GET, [], host=b"")),
    _c("host-space", "Host", _head(_GET, [], host=b"up other"), "400"),
    _c("host-userinfo", "Host", _head(_GET, [], host=b"user@up"), "400"),
    _c("host-port", "Host", _head(_GET, [], host=b"up:8080")),
    _c("host-ipv6", "Host", _head(_GET, [], host=b"[::1]:80")),
    _c("host-slash", "Host", _head(_GET, [], host=b"up/x"), "400"),
    _c("host-http10-missing", "Host", _head(_GET, [], host=None, version=b"1.0"), "relay",
       why="HTTP/1.0 needs no Host"),
    _c("host-http10-twice", "Host", _head(_GET, [b"Host: other"], version=b"1.0"), "400"),
]  # fmt: skip

EXPECT = [
    _c("expect-100-continue", "Expect", _post([b"Expect: 100-continue", _cl(b"hello")], b"hello")),
    _c("expect-unknown", "Expect", _post([b"Expect: something", _cl(b"hello")], b"hello"), "417"),
    _c("expect-100-http10", "Expect",
       _post([b"Expect: 100-continue", _cl(b"hello")], b"hello", version=b"1.0")),
    _c("expect-100-late-body", "Expect",
       (_post([b"Expect: 100-continue", _cl(b"hello")]), b"hello")),
]  # fmt: skip

PIPELINES = [
    _c("pipeline-two-gets", "pipelining", _head(_GET, []) + _head(b"GET /d", []),
       "relay,relay", targets=(b"/c", b"/d")),
    _c("pipeline-post-then-get", "pipelining",
       _post([_cl(b"hello")], b"hello") + _head(b"GET /d", []), "relay,relay",
       targets=(b"/c", b"/d")),
    _c("pipeline-chunked-then-get", "pipelining",
       _post([TE], _chunked(b"hello")) + _head(b"GET /d", []), "relay,relay",
       targets=(b"/c", b"/d")),
    _c("pipeline-bad-second", "pipelining", _head(_GET, []) + b"GET /d HTTP/1.1\r\nX\r\n\r\n",
       "relay,400", targets=(b"/c", b"/d")),
    _c("pipeline-three-split", "pipelining",
       (_head(_GET, []) + b"GET /d HT", b"TP/1.1\r\nHost: up\r\n\r\n" + _head(b"GET /e", [])),
       "relay,relay,relay", targets=(b"/c", b"/d", b"/e")),
    _c("pipeline-connection-close-first", "pipelining",
       _head(_GET, [b"Connection: close"]) + SMUGGLED, "relay",
       why="nothing after Connection: close is read"),
]  # fmt: skip

HTTP10 = [
    _c("http10-keep-alive", "HTTP/1.0",
       _head(_GET, [b"Connection: keep-alive"], version=b"1.0")
       + _head(b"GET /d", [], version=b"1.0"), "relay,relay", targets=(b"/c", b"/d")),
    _c("http10-post", "HTTP/1.0", _post([_cl(b"hello")], b"hello", version=b"1.0")),
    _c("http10-closes", "HTTP/1.0", _head(_GET, [], version=b"1.0") + SMUGGLED,
       why="an HTTP/1.0 connection closes after its answer"),
]  # fmt: skip

_LONG = b"X-Long: " + b"a" * 9000
LIMITS = [
    _c("request-line-too-long", "limits", _head(b"GET /" + b"a" * 9000, []), "414",
       targets=(b"/" + b"a" * 9000,)),
    _c("header-too-long", "limits", _head(_GET, [_LONG]), "431"),
    _c("too-many-headers", "limits", _head(_GET, [b"X-F%d: 1" % n for n in range(130)]), "431"),
    _c("trailers-too-many", "limits",
       _post([TE], _chunked(b"hello", last=b"0\r\n" + b"".join(
           b"X-Smuggled-%d: 1\r\n" % n for n in range(130)) + b"\r\n")), "400",
       "trailer fields count against the header limits"),
    _c("trailer-too-long", "limits",
       _post([TE], _chunked(b"hello", last=b"0\r\n" + _LONG + b"\r\n\r\n")), "400"),
]  # fmt: skip

REQUESTS: list[Case] = [*CL_TE, *CHUNKS, *TRAILERS, *HEADERS, *LINES, *HOSTS, *EXPECT,
                        *PIPELINES, *HTTP10, *LIMITS]  # fmt: skip


@dataclass(frozen=True)
class ResponseCase:
    name: str
    raw: bytes  # what the upstream writes to GET /r/<name>, in one write
    hangup: str  # what the proxy's client gets: a status, "cut" when the connection ends early
    close: bool = False  # the upstream closes after writing it
    why: str = ""


_OK = b"HTTP/1.1 200 OK\r\n"
_BOGUS = _OK + b"X-Seen: /smuggled\r\nContent-Length: 100\r\n\r\n"  # an answer nobody asked for


def _r(name: str, hangup: str, raw: bytes, *, close: bool = False, why: str = "") -> ResponseCase:
    return ResponseCase(name, raw, hangup, close, why)


RESPONSES = [
    _r("resp-cl-te", "502", _OK + b"Content-Length: 30\r\n" + TE + b"\r\n\r\n"
       + _chunked(b"hello") + _BOGUS),
    _r("resp-two-lengths", "502", _OK + b"Content-Length: 5\r\nContent-Length: 7\r\n\r\nhello!!"),
    _r("resp-same-length-twice", "502",
       _OK + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
    _r("resp-bad-chunk-size", "502", _OK + TE + b"\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
       why="nothing was sent yet: a 502, not a close"),
    _r("resp-chunk-longer", "200 cut", _OK + TE + b"\r\n\r\n3\r\nhello\r\n0\r\n\r\n"),
    _r("resp-gzip-chunked", "502", _OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n"
       + _chunked(b"hello"), why="the body is still gzip-coded once unchunked"),
    _r("resp-extra-after-length", "200", _OK + b"Content-Length: 2\r\n\r\nok" + _BOGUS,
       why="bytes past the answer's end, in the same read"),
    _r("resp-extra-after-chunked", "200", _OK + TE + b"\r\n\r\n" + _chunked(b"ok") + _BOGUS),
    _r("resp-204-with-body", "204",
       b"HTTP/1.1 204 No Content\r\nContent-Length: 50\r\n\r\n" + _BOGUS,
       why="a 204 has no body: what follows is not this answer's"),
    _r("resp-304-with-body", "304", b"HTTP/1.1 304 Not Modified\r\n\r\n" + _BOGUS),
    _r("resp-short-then-close", "200 cut", _OK + b"Content-Length: 10\r\n\r\nhello", close=True,
       why="a cut answer must not look complete"),
    _r("resp-chunked-cut", "200 cut", _OK + TE + b"\r\n\r\n5\r\nhello\r\n", close=True),
    _r("resp-by-close", "200", b"HTTP/1.1 200 OK\r\n\r\nhello", close=True),
    _r("resp-obs-fold", "502", _OK + b"X-A: 1\r\n X-Folded: 1\r\nContent-Length: 0\r\n\r\n"),
    _r("resp-bare-lf", "502", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
    _r("resp-nul-in-field", "502", _OK + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    _r("resp-interim-then-answer", "200",
       b"HTTP/1.1 100 Continue\r\n\r\n" + _OK + b"Content-Length: 2\r\n\r\nok"),
    _r("resp-101", "502", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
       b"Connection: upgrade\r\n\r\n" + _BOGUS, why="a switch nobody asked for"),
    _r("resp-garbage-status", "502", b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n"),
    _r("resp-not-http", "502", b"SSH-2.0-OpenSSH\r\n", close=True),
    _r("resp-te-http10", "200", b"HTTP/1.0 200 OK\r\n" + TE + b"\r\n\r\n" + _chunked(b"ok"),
       close=True),
    _r("resp-trailers", "200", _OK + TE + b"\r\n\r\n"
       + _chunked(b"ok", last=b"0\r\nX-Smuggled: 1\r\n\r\n")),
    _r("resp-huge-field", "502", _OK + b"X-Long: " + b"a" * 100_000
       + b"\r\nContent-Length: 0\r\n\r\n", why="the head is over 64 KiB"),
    _r("resp-negative-length", "502", _OK + b"Content-Length: -1\r\n\r\nok"),
]  # fmt: skip
