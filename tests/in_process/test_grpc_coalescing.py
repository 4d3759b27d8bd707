"""A ``ModelStreamInfer`` stream whose reader keeps up, and one whose reader falls behind
(DESIGN.md's "Streams that fall behind"), spoken to with plain gRPC stubs.

An in-process gateway (simulated engine) on 127.0.0.1:0. A reader that keeps up gets one
response per token, each request's last flagged ``triton_final_response``. A reader that pauses
and then reads gets a request's tokens that waited unwritten merged into fewer responses: every
token once, in order, the parameters and flags of the responses it stands for. Several requests
share the stream (their responses never merged together), one asks for the empty final response
(it stays a response of its own, after the text), one is not streamed.

The paused reader's client has a small receive window (``grpc.http2.lookahead_bytes`` 1 KiB, no
BDP probing: a client on a slow link). gRPC's client takes in its window's worth of responses
whether or not its application reads: with the default window (64 KiB, grown by probing) a
pause of a few hundred responses is absorbed there and the gateway's writer never falls behind.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from bench.base.waiting import wait_until
from gateway_server.engine.sim.config import SimConfig
from gateway_server.grpc.stream import CANCEL_ID
from gateway_server.grpc.tensors import decode_bytes_tensor, encode_bytes_tensor
from gateway_server.requests import EMPTY_FINAL_OPT_IN, FINAL_FLAG
from hangup_contract.protos import inference_pb2 as pb
from tests.support.gateway import MODEL, Gateway, running_gateway

MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


@dataclass(frozen=True)
class Ask:
    """One request of the stream: its id, tokens (``ignore_eos``, seeded), and how it is
    answered."""

    id: str
    tokens: int
    stream: bool = True
    empty_final: bool = False

    def message(self) -> bytes:
        request = pb.ModelInferRequest(model_name=MODEL, id=self.id)
        sampling = {"max_tokens": self.tokens, "ignore_eos": True, "seed": len(self.id) * 7}
        inputs = (("text_input", "BYTES", encode_bytes_tensor([f"prompt {self.id}".encode()])),
                  ("stream", "BOOL", bytes([self.stream])),
                  ("sampling_parameters", "BYTES",
                   encode_bytes_tensor([json.dumps(sampling).encode()])))  # fmt: skip
        for name, datatype, raw in inputs:
            request.inputs.add(name=name, datatype=datatype, shape=[1])
            request.raw_input_contents.append(raw)
        if self.empty_final:
            request.parameters[EMPTY_FINAL_OPT_IN].bool_param = True
        return request.SerializeToString()


@dataclass(frozen=True)
class Read:
    """One response as the client read it."""

    id: str
    text: str | None
    final: bool
    cancel_id: str
    error: str

    @classmethod
    def of(cls, raw: bytes) -> Read:
        message = pb.ModelStreamInferResponse.FromString(raw)
        response = message.infer_response
        text = None
        if response.outputs:
            assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
                ("text_output", "BYTES", [1])
            ]
            (element,) = decode_bytes_tensor(response.raw_output_contents[0], "text_output")
            text = element.decode()
        parameters = response.parameters
        assert set(parameters) == {FINAL_FLAG, CANCEL_ID}, parameters
        return cls(response.id, text, parameters[FINAL_FLAG].bool_param,
                   parameters[CANCEL_ID].string_param, message.error_message)  # fmt: skip


ASKS = [Ask("a", 40), Ask("bb", 40, empty_final=True), Ask("ccc", 40, stream=False),
        Ask("dddd", 40)]  # fmt: skip


@contextlib.asynccontextmanager
async def opened(
    gateway: Gateway, call_id: str, asks: list[Ask], options: list[Any] | None = None
) -> AsyncIterator[Any]:
    """A stream carrying ``asks``, its writing side closed: the call to read from."""
    address = gateway.server.listeners["grpc"]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = channel.stream_stream(MODEL_STREAM_INFER)(
            metadata=(("x-request-id", call_id),), timeout=60
        )
        for ask in asks:
            await call.write(ask.message())
        await call.done_writing()
        yield call


async def read_all(call: Any) -> dict[str, list[Read]]:
    """Every response until the stream ends, by request id."""
    by_request: dict[str, list[Read]] = {}
    while (raw := await call.read()) is not grpc.aio.EOF:
        read = Read.of(raw)
        assert not read.error, read
        by_request.setdefault(read.id, []).append(read)
    return by_request


def check_request(ask: Ask, call_id: str, reads: list[Read], text: str | None = None) -> None:
    """``reads`` answer ``ask`` as Triton's decoupled stream does, whatever was merged: its own
    cancel id on each, the final flag on the last only, the empty final (when asked for) last
    and on its own; ``text`` (when given) is every token, in order."""
    assert all(r.cancel_id == f"{call_id}:{ask.id}" for r in reads), reads
    assert [r.final for r in reads] == [False] * (len(reads) - 1) + [True], reads
    data = reads[:-1] if ask.empty_final else reads
    assert all(r.text is not None for r in data), reads
    if ask.empty_final:
        assert reads[-1].text is None, reads
    if text is not None:
        assert "".join(r.text or "" for r in data) == text


async def test_a_reader_that_keeps_up_gets_one_response_per_token() -> None:
    """Steps of 250 ms: the writer has each response written long before the next token. (At
    20 and 100 ms, with four busy processes beside the test on two cores, the gateway's writer,
    sharing this process with the client, now and then fell a step behind and merged two
    tokens, in 1 run of 6 and of 20: as it should, the writer being the slow part then.)"""
    asks = [Ask(a.id, 5, a.stream, a.empty_final) for a in ASKS]
    async with (
        running_gateway(sim=SimConfig(step_base_s=0.25, step_per_seq_s=0.0)) as gateway,
        opened(gateway, "keeps-up", asks) as call,
    ):
        by_request = await read_all(call)
    assert sorted(by_request) == sorted(a.id for a in asks)
    for ask in asks:
        reads = by_request[ask.id]
        check_request(ask, "keeps-up", reads)
        expected = (ask.tokens if ask.stream else 1) + ask.empty_final
        assert len(reads) == expected, (ask, [(r.text, r.final) for r in reads])


async def _generated(gateway: Gateway, call_id: str, tokens: int) -> bool:
    """The call's engine requests have made their ``tokens`` and ended (not merely not begun)."""
    call = (await gateway.in_flight()).get(call_id)
    return call is not None and (call["generated_tokens"], call["engine_requests"]) == (tokens, 0)


@pytest.mark.parametrize("tokens", [40, 400])
async def test_a_reader_that_falls_behind_gets_every_token_once_in_fewer_responses(
    tokens: int,
) -> None:
    """The same requests read once by a reader that reads all the time (what each request's text
    is; at 2 ms steps it too may fall behind now and then), then by one that reads nothing until
    every token is made: fewer responses, the same text."""
    asks = [Ask(a.id, tokens, a.stream, a.empty_final) for a in ASKS]
    async with running_gateway(sim=SimConfig(step_base_s=0.002, step_per_seq_s=0.0)) as gateway:
        async with opened(gateway, "reference", asks) as call:
            reference = await read_all(call)
        async with opened(gateway, "paused", asks, SMALL_WINDOW) as call:
            made = sum(a.tokens for a in asks)
            await wait_until(lambda: _generated(gateway, "paused", made), what="every token made")
            by_request = await read_all(call)
    assert sorted(by_request) == sorted(a.id for a in asks)
    for ask in asks:
        reads, expected = by_request[ask.id], reference[ask.id]
        text = "".join(r.text or "" for r in expected)
        check_request(ask, "reference", expected)
        check_request(ask, "paused", reads, text)
        if ask.stream:
            assert len(reads) < tokens // 2, (ask, len(reads))
        else:
            assert len(reads) == 1 + ask.empty_final
