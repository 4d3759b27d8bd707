"""Which Responses calls outlive their client (``proxy.cancel.responses``), and the ids the ``vllm``
adapter gives a Responses call (``proxy.cancel.servers``): rules without sockets."""

from __future__ import annotations

import json

import pytest

from proxy.cancel import responses
from proxy.cancel.servers import SglangAbort, VllmAbort, vllm_request_ids


@pytest.mark.parametrize(
    ("value", "background"),
    [
        (True, True), (1, True), (1.0, True), ("true", True), (" Yes ", True), ("on", True),
        (False, False), (0, False), ("false", False), ("no", False), (None, False),
        ("maybe", False), ([], False), (2, False),
    ],
)  # fmt: skip
def test_background_is_read_as_vllms_request_model_reads_it(
    value: object, background: bool
) -> None:
    """pydantic's lax booleans: anything vLLM would run in the background, the proxy must not
    cancel when the client leaves."""
    body = json.dumps({"model": "m", "input": "Hi", "background": value}).encode()
    assert responses.asks_for_background(body) is background


@pytest.mark.parametrize("body", [b'{"model": "m"}', b"[true]", b"not json", b"\xff\xfe"])
def test_a_body_that_asks_nothing_is_no_background_response(body: bytes) -> None:
    assert not responses.asks_for_background(body)


@pytest.mark.parametrize(
    ("method", "path", "reads", "names"),
    [
        ("POST", "/v1/responses", True, False),
        ("GET", "/v1/responses", False, False),
        ("POST", "/v1/responses/resp_1/cancel", False, True),
        ("GET", "/v1/responses/resp_1", False, True),
        ("DELETE", "/v1/responses/resp_1", False, True),
        ("POST", "/v1/chat/completions", False, False),
        ("POST", "/v1/responsesx", False, False),
    ],
)
def test_which_calls_are_read_and_which_name_an_earlier_response(
    method: str, path: str, reads: bool, names: bool
) -> None:
    assert responses.reads_body(method, path) is reads
    assert responses.names_a_response(path) is names


def test_vllm_ids_for_a_call() -> None:
    """Chat and completion ids come from X-Request-Id; a Responses call's first engine request
    is the body's request_id (which the proxy sets to ``resp_{id}``) with ``_0``."""
    assert vllm_request_ids("c1") == ["chatcmpl-c1", "cmpl-c1-0", "resp_c1_0"]


def test_the_vllm_adapter_tags_only_responses_bodies_and_replaces_the_clients_id() -> None:
    abort = VllmAbort()
    assert abort.tags("POST", "/v1/responses")
    assert not abort.tags("POST", "/v1/chat/completions")
    assert not abort.tags("GET", "/v1/responses/resp_1")
    tagged = abort.tag_body('{"input": "héllo", "request_id": "mine"}'.encode(), "c1")
    assert json.loads(tagged) == {"input": "héllo", "request_id": "resp_c1"}
    with pytest.raises(ValueError, match="not a JSON object"):
        abort.tag_body(b"[]", "c1")
    assert SglangAbort.tags("GET", "/anything")  # SGLang reads rid from every body
