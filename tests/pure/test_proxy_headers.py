"""Header rules without I/O: hop-by-hop fields, forwarding fields and request ids."""

from __future__ import annotations

import pytest

from proxy.errors import BadRequestId
from proxy.http.headers import client_response_headers, strip_hop_by_hop, upstream_request_headers
from proxy.request_ids import RequestIds, choose_request_ids


def test_hop_by_hop_fields_and_those_named_in_connection_are_dropped() -> None:
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
    assert strip_hop_by_hop(headers) == [("Host", "model"), ("Accept", "a"), ("Accept", "b")]


def test_upstream_headers_add_forwarding_fields_and_a_fresh_request_id() -> None:
    client = [("Host", "model"), ("X-Forwarded-For", "10.0.0.1"), ("Expect", "100-continue")]
    ids = choose_request_ids(client, trust_client=False)
    out = upstream_request_headers(client, ids=ids, client_addr="127.0.0.1", scheme="http")
    assert ("X-Forwarded-For", "10.0.0.1, 127.0.0.1") in out
    assert ("X-Forwarded-Proto", "http") in out
    assert ("X-Request-Id", ids.upstream) in out
    assert not any(name.lower() == "expect" for name, _ in out)
    assert len(ids.upstream) == 32 and int(ids.upstream, 16) >= 0


def test_each_call_gets_its_own_id_and_the_clients_is_kept_aside() -> None:
    client = [("X-Request-Id", "client-7")]
    first = choose_request_ids(client, trust_client=False)
    second = choose_request_ids(client, trust_client=False)
    assert first.upstream != second.upstream
    assert first.client == "client-7"
    out = upstream_request_headers(client, ids=first, client_addr=None, scheme="https")
    assert [v for n, v in out if n == "X-Request-Id"] == [first.upstream]
    assert ("X-Client-Request-Id", "client-7") in out
    assert ("X-Forwarded-Proto", "https") in out


def test_a_trusted_client_id_is_used_upstream_as_is() -> None:
    ids = choose_request_ids([("x-request-id", "abc.DEF-1:2_3")], trust_client=True)
    assert ids == RequestIds("abc.DEF-1:2_3", "abc.DEF-1:2_3")
    out = upstream_request_headers([], ids=ids, client_addr=None, scheme="http")
    assert not any(n == "X-Client-Request-Id" for n, _ in out)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "id/../other", "é"])
def test_a_trusted_client_id_must_be_safe(bad: str) -> None:
    with pytest.raises(BadRequestId) as caught:
        choose_request_ids([("X-Request-Id", bad)], trust_client=True)
    assert caught.value.status == 400


def test_response_headers_keep_content_length_echo_the_call_id_and_name_the_proxy() -> None:
    upstream = [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "12"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
        ("X-Request-Id", "from-upstream"),
        ("Server", "uvicorn"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]
    assert client_response_headers(upstream, request_id="call-1") == [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "12"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("X-Request-Id", "call-1"),
        ("Server", "hangup-proxy"),  # the upstream's implementation is not advertised
    ]
