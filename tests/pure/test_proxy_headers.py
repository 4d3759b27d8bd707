"""Header rules without I/O: hop-by-hop fields, forwarding fields and request ids."""

from __future__ import annotations

import pytest

from proxy.calls.request_ids import RequestIds, choose_request_ids, request_ids_for
from proxy.errors import BadRequestId
from proxy.http.headers import (
    add_ids,
    client_response_head,
    upstream_request_headers,
)


def test_hop_by_hop_request_fields_and_those_named_in_connection_are_not_sent_upstream() -> None:
    headers = [
        ("Host", "model"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic x"),
        ("X-Secret-Hop", "1"),
        ("Accept", "a"),
        ("Accept", "b"),
    ]
    head = upstream_request_headers(headers, client_addr=None, scheme="http")
    assert head.upstream == [
        ("Host", "model"),
        ("Accept", "a"),
        ("Accept", "b"),
        ("X-Forwarded-Proto", "http"),  # the proxy's own, added after the client's
    ]


def _upstream(
    client: list[tuple[str, str]], *, trust: bool = False, addr: str | None = None, scheme: str
) -> tuple[list[tuple[str, str]], RequestIds]:
    """The fields sent upstream for ``client``'s, and the call's ids (as the relay does)."""
    head = upstream_request_headers(client, client_addr=addr, scheme=scheme)
    ids = request_ids_for(head.request_id, trust_client=trust)
    add_ids(head.upstream, ids)
    return head.upstream, ids


def test_upstream_headers_add_forwarding_fields_and_a_fresh_request_id() -> None:
    client = [("Host", "model"), ("X-Forwarded-For", "10.0.0.1"), ("Expect", "100-continue")]
    assert upstream_request_headers(client, client_addr=None, scheme="http").expect == (
        "100-continue"
    )
    out, ids = _upstream(client, addr="127.0.0.1", scheme="http")
    assert ("X-Forwarded-For", "10.0.0.1, 127.0.0.1") in out
    assert ("X-Forwarded-Proto", "http") in out
    assert ("X-Request-Id", ids.upstream) in out
    assert not any(name.lower() == "expect" for name, _ in out)
    assert len(ids.upstream) == 32 and int(ids.upstream, 16) >= 0


def test_each_call_gets_its_own_id_and_the_clients_is_kept_aside() -> None:
    client = [("X-Request-Id", "client-7"), ("x-request-id", "client-8")]
    out, first = _upstream(client, scheme="https")
    second = choose_request_ids(client, trust_client=False)
    assert first.upstream != second.upstream
    assert first.client == second.client == "client-7"  # the first, as the gRPC relay reads it
    assert [v for n, v in out if n == "X-Request-Id"] == [first.upstream]
    assert ("X-Client-Request-Id", "client-7") in out
    assert ("X-Forwarded-Proto", "https") in out


def test_a_trusted_client_id_is_used_upstream_as_is() -> None:
    out, ids = _upstream([("x-request-id", "abc.DEF-1:2_3")], trust=True, scheme="http")
    assert ids == RequestIds("abc.DEF-1:2_3", "abc.DEF-1:2_3")
    assert [v for n, v in out if n == "X-Request-Id"] == ["abc.DEF-1:2_3"]
    assert not any(n == "X-Client-Request-Id" for n, _ in out)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "id/../other", "é"])
def test_a_trusted_client_id_must_be_safe(bad: str) -> None:
    with pytest.raises(BadRequestId) as caught:
        choose_request_ids([("X-Request-Id", bad)], trust_client=True)
    assert caught.value.status == 400


def test_response_headers_keep_content_length_echo_the_call_id_and_name_the_proxy() -> None:
    upstream = [
        (b"Content-Type", b"text/event-stream"),
        (b"Content-Length", b"12"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"close"),
        (b"X-Request-Id", b"from-upstream"),
        (b"Server", b"uvicorn"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
    ]
    head = client_response_head(upstream, request_id="call-1")
    assert head.lines == [
        b"Content-Type: text/event-stream",
        b"Content-Length: 12",
        b"Set-Cookie: a=1",
        b"Set-Cookie: b=2",
        b"X-Request-Id: call-1",
        b"Server: hangup-proxy",  # the upstream's implementation is not advertised
    ]
    assert head.sized and not head.dated


def test_a_response_field_that_connection_names_is_not_relayed_even_its_length() -> None:
    upstream = [(b"Connection", b"Content-Length, X-Hop"), (b"Content-Length", b"2"),
                (b"X-Hop", b"1"), (b"Date", b"Fri, 27 Nov 2026 06:00:00 GMT")]  # fmt: skip
    head = client_response_head(upstream, request_id="call-1")
    assert head.lines[:1] == [b"Date: Fri, 27 Nov 2026 06:00:00 GMT"]
    assert not head.sized and head.dated  # then the proxy frames the body itself
