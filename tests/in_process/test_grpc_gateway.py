"""The gateway's gRPC side, spoken to directly with Triton's own aio client and plain gRPC stubs.

An in-process gateway (simulated engine, 10 ms steps) on 127.0.0.1:0. Everything through the
proxy, with the sync client too, is in ``multi_process/test_grpc_through_proxy.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from bench.base.waiting import wait_until
from bench.harness.triton.io import Stream, cancel_id_of, inputs, is_final, text_of
from gateway_server.config import GatewayConfig
from gateway_server.server import GatewayServer
from hangup_contract.protos import cancellation_pb2
from hangup_contract.protos import inference_pb2 as pb
from tests.support.gateway import LONG, MODEL, Gateway, running_gateway


async def test_health_metadata_config_and_reflection(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    assert await client.is_server_live() and await client.is_server_ready()
    assert await client.is_model_ready(MODEL)
    metadata = await client.get_model_metadata(MODEL)
    assert [i.name for i in metadata.inputs][:2] == ["text_input", "stream"]
    assert [(o.name, o.datatype) for o in metadata.outputs] == [("text_output", "BYTES")]
    config = (await client.get_model_config(MODEL)).config
    assert config.model_transaction_policy.decoupled
    with pytest.raises(InferenceServerException, match="not served"):
        await client.get_model_metadata("other")

    async with grpc.aio.insecure_channel(gateway.server.listeners["grpc"]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "hangup.v1.Cancellation"):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in reflect.ServerReflectionInfo(iter([ask])):
            names = {s.name for s in answer.list_services_response.service}
        assert {"inference.GRPCInferenceService", "hangup.v1.Cancellation"} <= names


async def test_unary_infer_answers_what_the_http_api_answers(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    result = await client.infer(MODEL, inputs("Once upon", stream=False, max_tokens=6, seed=3))
    body = {"text_input": "Once upon", "max_tokens": 6, "seed": 3}
    async with gateway.session.post(f"{gateway.url}/v2/models/{MODEL}/generate", json=body) as r:
        expected = (await r.json())["text_output"]
    assert text_of(result) == expected and expected.startswith("Once upon")
    excluded = await client.infer(
        MODEL,
        [
            *inputs("Once upon", stream=False, max_tokens=6, seed=3),
            _bool("exclude_input_in_output", True),
        ],
    )
    assert text_of(excluded) == expected.removeprefix("Once upon")
    assert gateway.requests("completed", protocol="kserve_grpc") == 2


def _bool(name: str, value: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value]))
    return tensor


async def test_stream_interleaves_requests_and_flags_each_last_response(
    client: triton.InferenceServerClient,
) -> None:
    stream = Stream(client)
    stream.send("a", "first", max_tokens=5)
    stream.send("b", "second", max_tokens=3, stream=False)
    seen: dict[str, list[Any]] = {"a": [], "b": []}
    while not all(r and is_final(r[-1]) for r in seen.values()):
        result, error = await stream.next()
        assert error is None, error
        seen[result.get_response().id].append(result)
    streamed, whole = seen["a"], seen["b"]
    assert [is_final(r) for r in streamed] == [False] * (len(streamed) - 1) + [True]
    assert len(whole) == 1 and text_of(whole[0]).startswith("second")  # the prompt, then text
    assert not text_of(streamed[0]).startswith("first")  # streamed text never repeats it
    stream.close()


async def test_malformed_request_is_invalid_argument_and_the_stream_survives(
    client: triton.InferenceServerClient,
) -> None:
    stream = Stream(client)
    stream.send("bad", "x", max_tokens=0)
    _, error = await stream.next()
    assert error is not None and "INVALID_ARGUMENT" in str(error) and "max_tokens" in str(error)
    stream.send("good", "still here", max_tokens=3)
    assert text_of((await stream.until_final("good"))[0])
    stream.close()
    with pytest.raises(InferenceServerException, match=r"StatusCode\.INVALID_ARGUMENT"):
        await client.infer(MODEL, inputs("x", stream=False, max_tokens=0))


async def test_sampling_is_read_as_over_http_and_a_field_it_cannot_honour_refused(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    sampling = {"max_tokens": 5, "seed": 3, "top_k": 2, "logit_bias": {"7": 100}}
    result = await client.infer(MODEL, inputs("Once upon", stream=False, **sampling))
    body = {"text_input": "Once upon", "parameters": sampling}
    async with gateway.session.post(f"{gateway.url}/v2/models/{MODEL}/generate", json=body) as r:
        assert text_of(result) == (await r.json())["text_output"]
    for name, value in (("presence_penalty", 0.5), ("best_of", 2)):
        with pytest.raises(InferenceServerException, match=f"INVALID_ARGUMENT.*'{name}'"):
            await client.infer(MODEL, inputs("x", stream=False, max_tokens=2, **{name: value}))


async def test_one_request_of_a_stream_is_cancelled_alone(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    stream = Stream(client)
    stream.send("long", "keep going", max_tokens=LONG, ignore_eos=True)
    first, _ = await stream.next()
    stream.send("short", "meanwhile", max_tokens=4)
    status, body = await gateway.cancel(cancel_id_of(first), "explicit")
    assert status == 200 and body["state"] == "cancelled"
    errors, finished = [], []
    while not (errors and finished):
        result, error = await stream.next()
        if error is not None:
            errors.append(str(error))
        elif result.get_response().id == "short" and is_final(result):
            finished.append(result)
    assert "CANCELLED" in errors[0]
    assert gateway.cancellations("explicit", "decode") == 1
    stream.close()


async def test_cancelling_one_request_of_a_sequence_cancels_those_waiting_behind_it(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    stream = Stream(client)
    stream.send("s1", "one", max_tokens=LONG, ignore_eos=True, sequence_id=7, sequence_start=True)
    first, _ = await stream.next()
    stream.send("s2", "two", max_tokens=3, sequence_id=7)
    stream.send("s3", "three", max_tokens=3, sequence_id=7, sequence_end=True)
    stream.send("other", "elsewhere", max_tokens=3, sequence_id=8, sequence_start=True)
    # Requests are read in order: once "other" has answered, s2 and s3 wait behind s1.
    await stream.until_final("other")
    async with grpc.aio.insecure_channel(gateway.server.listeners["grpc"]) as channel:
        request = cancellation_pb2.CancelRequest(request_id=cancel_id_of(first))
        answer = await cancel_stub(channel)(request)
    assert answer.state == "cancelled" and answer.phase == "decode"
    errors = []
    while len(errors) < 3:
        _, error = await stream.next()
        if error is not None:
            errors.append(str(error))
    assert all("CANCELLED" in e for e in errors)
    assert sum("earlier request of its sequence" in e for e in errors) == 2
    assert gateway.requests("completed", protocol="kserve_grpc") == 1  # "other" only
    stream.close()


async def test_cancelling_the_stream_aborts_every_request_on_it(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    stream = Stream(client)
    for name in ("a", "b", "c"):
        stream.send(name, name, max_tokens=LONG, ignore_eos=True)
    started: set[str] = set()
    while len(started) < 3:
        result, _ = await stream.next()
        started.add(result.get_response().id)
    stream.responses.cancel()
    await wait_until(lambda: gateway.cancellations("grpc_cancelled", "decode") == 3)
    await wait_until(lambda: len(gateway.server.registry) == 0, what="nothing in flight")


async def test_unary_deadline_cancels_with_its_reason(
    gateway: Gateway, client: triton.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match="Deadline"):
        await client.infer(
            MODEL,
            inputs("slow", stream=False, max_tokens=LONG, ignore_eos=True),
            client_timeout=0.3,
        )
    await wait_until(lambda: gateway.cancellations("deadline_exceeded", "decode") == 1)


def cancel_stub(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        "/hangup.v1.Cancellation/Cancel",
        request_serializer=cancellation_pb2.CancelRequest.SerializeToString,
        response_deserializer=cancellation_pb2.CancelResponse.FromString,
    )


async def test_cancel_service_contract() -> None:
    async with (
        running_gateway(token="s3cret") as gateway,
        grpc.aio.insecure_channel(gateway.server.listeners["grpc"]) as channel,
    ):
        cancel = cancel_stub(channel)
        request = cancellation_pb2.CancelRequest(request_id="nobody", reason="explicit")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await cancel(request)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = (("authorization", "Bearer s3cret"),)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await cancel(request, metadata=auth)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        bad_reason = cancellation_pb2.CancelRequest(request_id="x", reason="??")
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await cancel(bad_reason, metadata=auth)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The id cancelled first is rejected when its call arrives (the tombstone).
        client = triton.InferenceServerClient(gateway.server.listeners["grpc"])
        try:
            with pytest.raises(InferenceServerException, match="CANCELLED"):
                await client.infer(MODEL, inputs("late"), headers={"x-request-id": "nobody"})
        finally:
            await client.close()


async def test_shutdown_reports_not_serving_and_cancels_streams_left_running() -> None:
    config = GatewayConfig(http_port=0, grpc_port=0, drain_timeout=0.2)
    server = GatewayServer(config, registry=CollectorRegistry())
    address = (await server.start())["grpc"]
    assert address is not None
    client = triton.InferenceServerClient(address)
    stream = Stream(client)
    stream.send("long", "forever", max_tokens=LONG, ignore_eos=True)
    await stream.next()
    shutdown = asyncio.create_task(server.shutdown())
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def not_serving() -> bool:
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            return bool(answer.status == health_pb2.HealthCheckResponse.NOT_SERVING)

        await wait_until(not_serving, what="health NOT_SERVING while draining")
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        while True:
            await stream.next()
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    assert ended.value.details() == "request cancelled (shutdown)"
    await shutdown
    await client.close()
    cancelled = {"model": MODEL, "reason": "shutdown", "phase": "decode"}
    assert server.metrics_registry.get_sample_value("hangup_gateway_cancellations_total", cancelled)


async def test_bytes_that_are_not_a_request_are_invalid_argument(gateway: Gateway) -> None:
    async with grpc.aio.insecure_channel(gateway.server.listeners["grpc"]) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(b"\xff\xff")
        assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid inference.ModelInferRequest" in (unary.value.details() or "")
        # On a stream it costs that message only: the next request is answered.
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )()
        await call.write(b"\xff\xff\xff")
        bad = await call.read()
        assert bad.error_message.startswith("INVALID_ARGUMENT: the message is not a valid")
        await call.write(text_request("good", "still served", 3).SerializeToString())
        good = await call.read()
        assert not good.error_message and good.infer_response.id == "good"
        call.cancel()
        # The same for every other service, the libraries' included (grpc.aio's own answer to a
        # message its deserializer cannot parse is UNKNOWN "Unexpected DecodeError").
        for method, expected in [
            ("/hangup.v1.Cancellation/Cancel", "hangup.v1.CancelRequest"),
            ("/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as other:
                await channel.unary_unary(method)(b"\xff\xff", timeout=5)
            assert other.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert other.value.details() == f"the message is not a valid {expected}"
        reflection = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        )(iter([b"\xff\xff"]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            await reflection.read()
        assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await wait_until(lambda: len(gateway.server.registry) == 0, what="the call closed")


async def test_a_stream_request_id_is_any_string_of_at_most_128_characters(
    gateway: Gateway,
) -> None:
    """A request's id is echoed twice in every response (``id``, ``hangup_request_id``): a 262 KB
    request once made 105 MB of responses (issue 60). Any string of up to 128 characters is taken,
    as Triton takes it, and its alias cancels that request alone; a longer id is refused in the
    stream with an error that carries no id, and the stream goes on."""
    own = "a request / ünïcode " + "x" * 108
    assert len(own) == 128
    async with grpc.aio.insecure_channel(gateway.server.listeners["grpc"]) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(metadata=(("x-request-id", "ids-stream"),))
        await call.write(text_request("i" * (1 << 20), "refused", 3).SerializeToString())
        refused = await call.read()
        assert refused.error_message.startswith("INVALID_ARGUMENT: request id 'iiii")
        assert "at most 128 characters" in refused.error_message
        assert refused.infer_response.id == "" and refused.ByteSize() < 500
        await call.write(text_request(own, "keep going", LONG, ignore_eos=True).SerializeToString())
        await wait_until(lambda: len(gateway.server.registry) == 1, what="the stream's call")
        await wait_until(
            lambda: gateway.server.registry.holds(f"ids-stream:{own}"), what="the request"
        )
        answer = await cancel_stub(channel)(
            cancellation_pb2.CancelRequest(request_id=f"ids-stream:{own}")
        )
        assert answer.state == "cancelled"
        cancelled = await call.read()
        assert cancelled.error_message.startswith("CANCELLED")
        assert cancelled.infer_response.id == own
        await call.write(text_request("next", "still served", 2).SerializeToString())
        good = await call.read()
        assert not good.error_message and good.infer_response.id == "next"
        call.cancel()


def text_request(request_id: str, prompt: str, max_tokens: int, **sampling: Any) -> Any:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(prompt.encode())
    params = request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    body = {"max_tokens": max_tokens, **sampling}
    params.contents.bytes_contents.append(json.dumps(body).encode())
    return request
