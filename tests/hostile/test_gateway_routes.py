"""Attacks on the gateway's routes, ids and token, against live processes (``python -m
gateway_server --engine sim``, with and without ``--cancel-token-file`` and ``--api-processes``):

- client input that was a 500 with an error-level traceback (``logit_bias`` keys, JSON nested
  past Python's reader, numbers past its digits, the Responses list's ``starting_after``) is a
  400 in the shape of the API, and the gateway logs nothing at error level;
- no response route cancels, reads or replaces another client's call or response: response ids
  are the gateway's own, a response cancel acts only on a response record (no call id, no gRPC
  stream alias, no tombstone), and a reused ``X-Request-Id`` never replaces a stored response;
- a cancel id past the cancel rule is refused before it is looked up, remembered or sent to
  another API process, so it holds no memory and never breaks the channel between them;
- a gateway that would serve the cancel API open on an address other than loopback does not
  start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from bench.base.processes import REPO, Process, child_env, enter_together, log_events, spawn
from bench.base.waiting import poll_until, wait_until
from bench.harness.log_records import records
from gateway_server.siblings import home_of
from hangup_contract.protos import cancellation_pb2
from hangup_contract.protos import inference_pb2 as pb

MODEL = "hangup-sim"
TOKEN = "routes-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AUTH_METADATA = (("authorization", f"Bearer {TOKEN}"),)
SIM = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", "--sim-step-base", "0.005"]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Process]]:
    """``open``: no token; ``guarded``: a token; ``pair``: a token and two API processes, each
    with a gRPC port of its own (so a call picks the process it lands on)."""
    tmp = tmp_path_factory.mktemp("routes")
    token = tmp / "token"
    token.write_text(TOKEN)
    guarded = [*SIM, "--cancel-token-file", str(token)]
    pair = [*guarded, "--workers", "2", "--api-processes", "2", "--grpc-process-ports", "0"]
    with contextlib.ExitStack() as stack:
        started = enter_together(
            stack,
            spawn("gateway_server", SIM, tmp / "open"),
            spawn("gateway_server", guarded, tmp / "guarded"),
            spawn("gateway_server", pair, tmp / "pair"),
        )
        yield dict(zip(["open", "guarded", "pair"], started, strict=True))


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], rid: str | None = None
) -> dict[str, Any]:
    headers = {"X-Request-Id": rid} if rid else {}
    async with session.post(f"{url}/v1/responses", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


def _text_request(request_id: str, max_tokens: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"hi")
    params = request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    sampling = {"max_tokens": max_tokens, "ignore_eos": True}
    params.contents.bytes_contents.append(json.dumps(sampling).encode())
    return request


def _cancel_method(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        "/hangup.v1.Cancellation/Cancel",
        request_serializer=cancellation_pb2.CancelRequest.SerializeToString,
        response_deserializer=cancellation_pb2.CancelResponse.FromString,
    )


def errors_logged(gateway: Process) -> list[dict[str, Any]]:
    """The gateway's log records at error level (a traceback is one)."""
    return [r for r in records(gateway.log()) if str(r.get("level")).lower() == "error"]


# -- client input that was a 500 -----------------------------------------------------------------


def _completion(extra: str) -> str:
    return f'{{"model": "{MODEL}", "prompt": "x", "max_tokens": 2, {extra}}}'


DIGITS = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
WERE_500S = [
    ("/v1/completions", _completion('"logit_bias": {"²": 1}'), "logit_bias"),
    ("/v1/completions", _completion('"logit_bias": {"--1": 1}'), "logit_bias"),
    ("/v1/completions", _completion(f'"logit_bias": {{"{DIGITS}": 1}}'), "logit_bias"),
    ("/v1/completions", _completion(f'"temperature": 1{"0" * 400}'), "temperature"),
    ("/v1/completions", _completion(f'"max_tokens": {DIGITS}'), None),
    ("/v1/completions", _completion(f'"metadata": {DEEP}'), None),
    ("/v1/chat/completions", DEEP, None),
    ("/v1/responses", f'{{"model": "{MODEL}", "input": {DEEP}}}', None),
    ("/v2/models/hangup-sim/generate", f'{{"text_input": {DEEP}}}', None),
    ("/v2/requests/x/cancel", DEEP, None),
]


async def test_client_input_that_was_a_500_is_a_400_and_logs_no_error(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    gateway = gateways["open"]
    url = gateway.url()
    for path, body, param in WERE_500S:
        headers = {"Content-Type": "application/json"}
        async with session.post(url + path, data=body.encode(), headers=headers) as resp:
            answer = await resp.json()
            assert resp.status == 400, (path, body[:60], answer)
        if path.startswith("/v1/"):  # OpenAI's error shape, naming the field where there is one
            assert answer["error"]["type"] == "invalid_request_error"
            assert answer["error"]["param"] == param
    clamped = _completion(f'"logit_bias": {{"5": 1{"0" * 400}}}')  # as vLLM: clamped to 100
    async with session.post(url + "/v1/completions", data=clamped) as resp:
        assert resp.status == 200, await resp.text()
    made = await _post(session, url, {"model": MODEL, "input": "x", "background": True})
    for after in ("²", DIGITS, "--1"):
        listing = f"{url}/v1/responses/{made['id']}"
        params = {"stream": "true", "starting_after": after}
        async with session.get(listing, params=params) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "starting_after"
    assert errors_logged(gateway) == []


# -- response routes: records only, ids the gateway's own ------------------------------------------


async def _chat_stream(
    session: aiohttp.ClientSession, url: str, rid: str
) -> aiohttp.ClientResponse:
    """A victim's chat stream under ``rid`` (about a second long), read up to its first chunk."""
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    resp = await session.post(
        f"{url}/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    )
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")
    return resp


async def _ends_whole(resp: aiohttp.ClientResponse) -> None:
    rest = await resp.content.read()
    assert rest.rstrip().endswith(b"data: [DONE]") and b'"cancelled"' not in rest, rest[-300:]


async def test_a_response_cancel_never_cancels_a_call_and_needs_what_the_token_guards(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    """With a token: ``/v2/requests/V/cancel`` is 401, and ``/v1/responses/resp_V/cancel`` names
    no response, so it is 404 and the victim's chat stream goes on to its end."""
    url = gateways["guarded"].url()
    victim = await _chat_stream(session, url, "victim-chat-1")
    async with session.post(f"{url}/v2/requests/victim-chat-1/cancel") as resp:
        assert resp.status == 401
    async with session.post(f"{url}/v1/responses/resp_victim-chat-1/cancel") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["param"] == "response_id"
    await _ends_whole(victim)


async def test_a_response_cancel_of_an_unknown_id_leaves_no_tombstone(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    url = gateways["guarded"].url()
    async with session.post(f"{url}/v1/responses/resp_victim-later/cancel") as resp:
        assert resp.status == 404
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(
        f"{url}/v1/chat/completions", json=body, headers={"X-Request-Id": "victim-later"}
    ) as resp:
        assert resp.status == 200  # not 499: nothing was left waiting for it


async def test_a_response_cancel_never_cancels_a_stream_request_by_its_alias(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    gateway = gateways["guarded"]
    async with grpc.aio.insecure_channel(gateway.listeners["grpc"]) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(metadata=[("x-request-id", "victim-stream")])
        await stream.write(_text_request("r1", 200).SerializeToString())
        async with session.post(
            f"{gateway.url()}/v1/responses/resp_victim-stream:r1/cancel"
        ) as resp:
            assert resp.status == 404
        answer = await asyncio.wait_for(stream.read(), 30)
        assert not answer.error_message, answer.error_message
        assert answer.infer_response.id == "r1"
        stream.cancel()


async def test_a_reused_request_id_never_reads_or_replaces_another_clients_response(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    """The attacker reuses the victim's ended ``X-Request-Id``: its response gets an id of its
    own, the victim's stored record is untouched (its ``previous_response_id`` runs on its own
    turn), and a response id made of the request id names nothing to read or delete."""
    url = gateways["guarded"].url()
    asked = {"model": MODEL, "max_output_tokens": 4}
    victim = await _post(session, url, asked | {"input": "the victim's question"}, "shared-1")
    attacker = await _post(session, url, asked | {"input": "an attacker's turn"}, "shared-1")
    async with session.get(f"{url}/v1/responses/{victim['id']}") as resp:
        assert (await resp.json())["output"] == victim["output"]
    assert attacker["id"] != victim["id"]
    again = await _post(
        session, url, asked | {"input": "go on", "previous_response_id": victim["id"]}
    )
    alone = {"input": [{"role": "user", "content": "the victim's question"},
                       {"role": "assistant", "content": _text(victim)},
                       {"role": "user", "content": "go on"}]}  # fmt: skip
    expected = await _post(session, url, asked | alone)
    assert again["usage"]["input_tokens"] == expected["usage"]["input_tokens"]
    assert _text(again) == _text(expected)
    for method in ("GET", "DELETE"):
        async with session.request(method, f"{url}/v1/responses/resp_shared-1") as resp:
            assert resp.status == 404, method
    async with session.get(f"{url}/v1/responses/{victim['id']}") as resp:
        assert resp.status == 200  # the DELETE above reached nothing of the victim's
    assert all(re.fullmatch(r"resp_[0-9a-f]{32}", r["id"]) for r in (victim, attacker, again))


def _text(response: dict[str, Any]) -> str:
    return str(response["output"][0]["content"][0]["text"])


# -- cancel ids held to the rule ---------------------------------------------------------------


async def test_a_cancel_id_past_the_rule_is_refused_before_it_is_held(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    """No token: 20 gRPC cancels of 4 MiB ids (each was a tombstone kept for a minute, and its
    answer echoed it whole) and an HTTP cancel of a 300-character id are refused as invalid, at
    once. (What an id the rule takes may hold, in bytes and time, is tests/pure/test_registry.py's
    to show: the gateway's RSS after such messages says more of gRPC's and the allocator's pools
    than of what the gateway keeps.)"""
    gateway = gateways["open"]
    async with session.post(f"{gateway.url()}/v2/requests/{'x' * 300}/cancel") as resp:
        assert resp.status == 400
        assert "the id to cancel must be" in (await resp.json())["error"]
    async with grpc.aio.insecure_channel(gateway.listeners["grpc"]) as channel:
        cancel = _cancel_method(channel)
        for i in range(20):
            request = cancellation_pb2.CancelRequest(request_id=f"{i}-" + "x" * (4 << 20))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await cancel(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert len(refused.value.details() or "") < 300


async def test_a_cancel_id_past_the_line_limit_never_reaches_the_channel_between_api_processes(
    gateways: dict[str, Process], session: aiohttp.ClientSession
) -> None:
    """An id whose JSON passes the sibling channel's line limit (12 MiB of control characters:
    72 MiB as JSON), sent to the process that is not its home, is refused there; the channel
    between the API processes never sees it, and a cancel across them still works."""
    gateway = gateways["pair"]
    first, second = gateway.listeners["grpc_processes"].split(",")
    huge = "\x01" * (12 << 20)
    while home_of(huge, 2) != 1:
        huge += "\x01"
    async with grpc.aio.insecure_channel(first) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _cancel_method(channel)(
                cancellation_pb2.CancelRequest(request_id=huge), metadata=AUTH_METADATA, timeout=60
            )
    assert refused.value.code() in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    far = "far-" + next(str(i) for i in range(100) if home_of(f"far-{i}", 2) == 0)
    async with grpc.aio.insecure_channel(second) as channel:  # runs on process 1, home 0
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(metadata=[("x-request-id", far)])
        await stream.write(_text_request("r1", 2000).SerializeToString())
        await _wait_in_flight(session, gateway, far)
        async with grpc.aio.insecure_channel(first) as other:
            answer = await _cancel_method(other)(
                cancellation_pb2.CancelRequest(request_id=far), metadata=AUTH_METADATA, timeout=30
            )
        assert answer.state == "cancelled"
        stream.cancel()
    assert log_events(gateway, "sibling_channel_error", "sibling_line_too_long") == []


async def _wait_in_flight(session: aiohttp.ClientSession, gateway: Process, rid: str) -> None:
    async def held() -> bool:
        async with session.get(f"{gateway.url()}/v2/requests", headers=AUTH) as resp:
            return any(r["request_id"] == rid for r in (await resp.json())["requests"])

    await wait_until(held, what=f"{rid} in flight")


# -- an open cancel API off loopback --------------------------------------------------------------


def test_a_gateway_with_an_open_cancel_api_off_loopback_does_not_start(tmp_path: Path) -> None:
    """``--host 0.0.0.0`` without ``--cancel-token-file``: it exits at once naming the way out,
    before it listens anywhere (were it to start, it is stopped as soon as it says so)."""
    ready = tmp_path / "ready"
    log = tmp_path / "log"
    command = [sys.executable, "-m", "gateway_server", *SIM, "--host", "0.0.0.0",
               "--ready-file", str(ready)]  # fmt: skip
    with log.open("wb") as out:
        popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                 cwd=REPO)  # fmt: skip
    try:
        poll_until(lambda: popen.poll() is not None or ready.exists(), 60, "the gateway exited")
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait()
    assert not ready.exists() and popen.returncode != 0
    assert "--allow-open-cancel-api" in log.read_text()
