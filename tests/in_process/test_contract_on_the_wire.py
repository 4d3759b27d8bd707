"""The contract over real sockets: the proxy's cancel adapter cancels one request of a gRPC
stream on the in-process gateway by an alias full of characters a URL path cannot carry as they
are, and the gateway refuses, on both transports, an id that breaks the rule."""

from __future__ import annotations

import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from bench.harness.triton.io import Stream, cancel_id_of, inputs
from hangup_contract import request_id
from hangup_contract.cancel_labels import Reason
from proxy.cancel.http import HangupCancel, HttpCancelAdapter
from proxy.labels import CancelResult
from tests.support.gateway import LONG, MODEL, Gateway


async def test_the_proxy_cancels_a_stream_request_by_an_alias_of_any_characters(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    stream = Stream(client)
    stream.send("req/1 ?#%", "Hello", max_tokens=LONG, ignore_eos=True)
    first, error = await stream.next()
    assert error is None, error
    alias = cancel_id_of(first)
    assert alias.endswith(":req/1 ?#%")
    adapter = HttpCancelAdapter(HangupCancel(), gateway.url, gateway.token, attempt_timeout=5.0)
    try:
        assert await adapter.cancel(alias, Reason.EXPLICIT) is CancelResult.OK
        while error is None:  # responses already on their way come first
            _, error = await stream.next()
        assert "CANCELLED" in str(error)
        assert await adapter.cancel(alias, Reason.EXPLICIT) is CancelResult.FINISHED
    finally:
        stream.close()
        await adapter.close()
    assert gateway.cancellations("explicit", "decode") == 1


async def test_the_gateway_refuses_an_id_that_breaks_the_rule(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    url = gateway.url + "/v1/completions"
    async with gateway.session.post(url, json=body, headers={"X-Request-Id": "a b"}) as resp:
        assert resp.status == 400
        assert request_id.RULE in (await resp.json())["error"]["message"]
    with pytest.raises(InferenceServerException) as caught:
        await client.infer(MODEL, inputs("Hi", stream=False, max_tokens=2),
                           headers={"x-request-id": "a/b"})  # fmt: skip
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert request_id.RULE in (caught.value.message() or "")
