"""Hostile gRPC clients against the gateway (docs/security.md, "gRPC messages and streams").

First the parsers, with no I/O: the tensor decoder and a stream's request parsing get hostile
messages up to the gRPC receive limit, and each must be refused (``InvalidRequest``, the stream's
``INVALID_ARGUMENT``) within the CPU budget of ``bench/harness/hostile.py``. Then attacks on
running gateways, each with a victim client timed and ``/v2/health/live`` polled meanwhile: a
60 MiB message (an in-process gateway, its event loop watched by ``ArmedLoop``); a stream with
huge ids that never reads its responses, and a stream of 20,000 requests (``python -m
gateway_server --engine sim``, its memory read from ``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.base.processes import Process, spawn
from bench.base.scrape import scrape_async, total
from bench.base.waiting import wait_until
from bench.harness.hostile import MIB, ArmedLoop, Budget, timed
from gateway_server.config import GatewayConfig
from gateway_server.errors import ClientError, InvalidRequest
from gateway_server.grpc.common import parse
from gateway_server.grpc.stream import cancel_alias, prepare
from gateway_server.grpc.tensors import (
    decode_bytes_tensor,
    decode_request,
    encode_bytes_tensor,
    parameter,
)
from hangup_contract.protos import cancellation_pb2
from hangup_contract.protos import inference_pb2 as pb
from tests.support.gateway import MODEL, running_gateway, unstarted_service

LIMIT = GatewayConfig().max_body_bytes
"""The gRPC receive limit by default (the HTTP body limit's): the largest message a parser here
can be handed."""
CALL_ID = "0123456789abcdef0123456789abcdef"  # a fresh call id's length (32 hex digits)
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


# -- hostile messages ------------------------------------------------------------------------


def _message(request_id: str = "h") -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name=MODEL, id=request_id)


def _raw_input(message: pb.ModelInferRequest, name: str, datatype: str, raw: bytes) -> None:
    message.inputs.add(name=name, datatype=datatype, shape=[1])
    message.raw_input_contents.append(raw)


def _text(prompt: str = "hi") -> bytes:
    return encode_bytes_tensor([prompt.encode()])


def empty_bytes_elements(size: int) -> pb.ModelInferRequest:
    """The issue's message: a raw BYTES tensor of nothing but empty elements."""
    message = _message()
    _raw_input(message, "text_input", "BYTES", b"\x00" * (size // 4 * 4))
    return message


def one_byte_elements(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "text_input", "BYTES", b"\x01\x00\x00\x00a" * (size // 5))
    return message


def raw_bools(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "text_input", "BYTES", _text())
    _raw_input(message, "stream", "BOOL", b"\x01" * size)
    return message


def typed_bytes(size: int) -> pb.ModelInferRequest:
    message = _message()
    tensor = message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.extend([b""] * (size // 2))
    return message


def typed_bools(size: int) -> pb.ModelInferRequest:
    message = _message()
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    message.inputs[0].contents.bytes_contents.append(b"hi")
    tensor = message.inputs.add(name="stream", datatype="BOOL", shape=[1])
    tensor.contents.bool_contents.extend([True] * size)
    return message


def many_dims(size: int) -> pb.ModelInferRequest:
    message = _message()
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1] * size)
    message.raw_input_contents.append(_text())
    return message


def huge_dims(size: int) -> pb.ModelInferRequest:
    message = _message()
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1 << 62] * (size // 10))
    message.raw_input_contents.append(_text())
    return message


def many_outputs(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "text_input", "BYTES", _text())
    message.outputs.extend([pb.ModelInferRequest.InferRequestedOutputTensor(name="text_output")]
                           * (size // 14))  # fmt: skip
    return message


def many_inputs(size: int) -> pb.ModelInferRequest:
    message = _message()
    for _ in range(size // 24):
        message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    return message


def long_names(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "n" * (size // 2), "BYTES", _text())
    message.outputs.add(name="o" * (size // 2))
    return message


def long_id(size: int) -> pb.ModelInferRequest:
    message = _message("i" * size)
    _raw_input(message, "text_input", "BYTES", _text())
    return message


def deep_sampling(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "text_input", "BYTES", _text())
    _raw_input(message, "sampling_parameters", "BYTES", encode_bytes_tensor([b"[" * size]))
    return message


def long_sequence_id(size: int) -> pb.ModelInferRequest:
    message = _message()
    _raw_input(message, "text_input", "BYTES", _text())
    _raw_input(message, "stream", "BOOL", b"\x01")
    message.parameters["sequence_id"].string_param = "s" * size
    return message


HOSTILE: dict[str, Callable[[int], pb.ModelInferRequest]] = {
    "raw BYTES of empty elements": empty_bytes_elements,
    "raw BYTES of one-byte elements": one_byte_elements,
    "raw BOOL of every byte": raw_bools,
    "typed bytes_contents": typed_bytes,
    "typed bool_contents": typed_bools,
    "a shape of many dimensions": many_dims,
    "a shape of huge dimensions": huge_dims,
    "many outputs": many_outputs,
    "one input many times": many_inputs,
    "long input and output names": long_names,
    "a long request id": long_id,
    "sampling_parameters nested deep": deep_sampling,
    "a long sequence id": long_sequence_id,
}


def sized(build: Callable[[int], pb.ModelInferRequest], target: int) -> bytes:
    """``build``'s message as close under ``target`` bytes as its unit allows."""
    raw = build(target).SerializeToString()
    if len(raw) > target:  # framing overhead: scale down once, then it fits
        raw = build(target - (len(raw) - target) - 64).SerializeToString()
    assert len(raw) <= target
    return raw


# -- the parsers, within the CPU budget --------------------------------------------------------


def decode(raw: bytes) -> Any:
    """What ModelInfer does with a message before it reaches the service."""
    return decode_request(parse(pb.ModelInferRequest, raw))


def read_stream_request(raw: bytes) -> Any:
    """What a stream does with a message before it reaches the service: the message, the id
    that would cancel it, its sequence, its tensors."""
    request = parse(pb.ModelInferRequest, raw)
    cancel_alias(CALL_ID, request.id)
    parameter(request, "sequence_id")
    return decode_request(request)


def _cut(value: object) -> str:
    """``value`` for an assertion message: a failure must not print the 8 MiB it was sent."""
    text = repr(value)
    return text if len(text) <= 300 else f"{text[:300]}... ({len(text)} characters)"


REFUSED_BY_THE_DECODER = [
    k for k in HOSTILE if k not in ("a long request id", "a long sequence id")
]


@pytest.mark.parametrize("kind", REFUSED_BY_THE_DECODER)
def test_hostile_tensors_at_the_receive_limit_are_refused_within_the_budget(kind: str) -> None:
    raw = sized(HOSTILE[kind], LIMIT)
    outcome = timed(decode, raw)
    assert isinstance(outcome.error, InvalidRequest), _cut(outcome.error or outcome.result)
    Budget().check(kind, len(raw), outcome.spent)
    assert len(outcome.error.message) < 400, _cut(outcome.error)  # a client's strings, cut


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_streams_hostile_request_at_the_receive_limit_is_refused_within_the_budget(
    kind: str,
) -> None:
    raw = sized(HOSTILE[kind], LIMIT)
    outcome = timed(read_stream_request, raw)
    if kind == "a long sequence id":  # a sequence id is a key, hashed once: accepted
        assert outcome.error is None, _cut(outcome.error)
    else:
        assert isinstance(outcome.error, InvalidRequest), _cut(outcome.error or outcome.result)
        assert len(outcome.error.message) < 400, _cut(outcome.error)
    Budget().check(kind, len(raw), outcome.spent)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(list(HOSTILE)), min_size=1, max_size=3),
    size=st.integers(min_value=1, max_value=LIMIT // 3),
)
def test_any_mix_of_hostile_parts_is_read_or_refused_within_the_budget(
    kinds: list[str], size: int
) -> None:
    """Parts of several hostile messages in one: the stream's parsing answers within the budget,
    a text request or an InvalidRequest, never anything else."""
    message = pb.ModelInferRequest()
    for kind in kinds:
        message.MergeFrom(HOSTILE[kind](size))
    raw = message.SerializeToString()
    outcome = timed(read_stream_request, raw)
    assert outcome.error is None or isinstance(outcome.error, InvalidRequest), _cut(outcome.error)
    Budget().check(" + ".join(kinds), len(raw), outcome.spent)


SERVICE = unstarted_service()


def _sampling_texts() -> st.SearchStrategy[bytes]:
    arrays = st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth)
    objects = st.integers(1, 3000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth)
    deep = arrays | objects
    inside = deep.map(lambda value: '{"max_tokens": 4, "stop": ' + value + "}")
    numbers = st.sampled_from(["1" * 5000, "-" + "9" * 4301, "1e400", "NaN", str(10**4000)])
    fields = st.sampled_from(["max_tokens", "seed", "temperature", "top_k", "logit_bias"])
    numbered = st.builds(lambda f, n: '{"' + f + '": ' + n + "}", fields, numbers)
    return st.one_of(deep, inside, numbered, st.just("[" * 100_000)).map(str.encode) | st.binary(
        max_size=64
    )


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(_sampling_texts())
def test_any_sampling_parameters_json_is_read_or_refused_within_the_budget(raw: bytes) -> None:
    """``sampling_parameters`` goes through the gateway's one JSON reader
    (``requests.json_object``), as every JSON a client sends: nested past Python's reader or a
    number of more than 4,300 digits is ``INVALID_ARGUMENT`` (a ValueError was UNKNOWN)."""
    message = _message()
    _raw_input(message, "text_input", "BYTES", _text())
    _raw_input(message, "sampling_parameters", "BYTES", encode_bytes_tensor([raw]))
    wire = message.SerializeToString()
    gc.collect()
    outcome = timed(lambda: prepare(SERVICE, parse(pb.ModelInferRequest, wire)))
    assert outcome.error is None or isinstance(outcome.error, ClientError), _cut(outcome.error)
    Budget().check("sampling_parameters", len(wire), outcome.spent)


# -- clients that watch and clients that wait --------------------------------------------------


@dataclass
class Liveness:
    """``/v2/health/live`` polled every 100 ms while the block runs: every answer and how long it
    took (a probe that got no answer within 5 s counts as status 0)."""

    session: aiohttp.ClientSession
    url: str
    answers: list[tuple[int, float]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def polling(self) -> AsyncIterator[Liveness]:
        task = asyncio.create_task(self._poll())
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            started = time.monotonic()
            try:
                async with self.session.get(f"{self.url}/v2/health/live", timeout=_timeout(5)) as r:
                    status = r.status
            except TimeoutError:
                status = 0
            self.answers.append((status, time.monotonic() - started))
            await asyncio.sleep(0.1)

    def check(self, slowest: float = 1.0, probes: int = 5) -> None:
        """Every probe answered 200 within ``slowest`` seconds, and at least ``probes`` ran."""
        assert len(self.answers) >= probes, self.answers
        failed = [a for a in self.answers if a[0] != 200 or a[1] > slowest]
        assert not failed, f"liveness probes failed or slower than {slowest} s: {failed[:10]}"


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def victim_completion(session: aiohttp.ClientSession, url: str, limit: float = 15) -> float:
    """Seconds a 5-token completion took (``limit`` when it did not answer within it)."""
    body = {"model": MODEL, "prompt": "a victim", "max_tokens": 5}
    started = time.monotonic()
    try:
        async with session.post(f"{url}/v1/completions", json=body, timeout=_timeout(limit)) as r:
            assert r.status == 200, await r.text()
            await r.read()
    except TimeoutError:
        return limit
    return time.monotonic() - started


async def victim_chat_gap(session: aiohttp.ClientSession, url: str, tokens: int) -> float:
    """The longest wait between a streamed chat's events, its first included."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a victim"}],
            "max_tokens": tokens, "stream": True, "ignore_eos": True}  # fmt: skip
    last, longest = time.monotonic(), 0.0
    async with session.post(f"{url}/v1/chat/completions", json=body, timeout=_timeout(60)) as r:
        assert r.status == 200, await r.text()
        async for _ in r.content:
            now = time.monotonic()
            longest, last = max(longest, now - last), now
    return longest


def request_bytes(request_id: str, *, stream: bool, max_tokens: int) -> bytes:
    message = _message(request_id)
    _raw_input(message, "text_input", "BYTES", _text("an attacker"))
    _raw_input(message, "stream", "BOOL", bytes([stream]))
    sampling = json.dumps({"max_tokens": max_tokens, "ignore_eos": True}).encode()
    _raw_input(message, "sampling_parameters", "BYTES", encode_bytes_tensor([sampling]))
    return message.SerializeToString()


# -- a message as large as a client may send ----------------------------------------------------


async def test_a_60_mib_message_is_refused_unread_and_nobody_else_notices() -> None:
    huge = empty_bytes_elements(60 * MIB).SerializeToString()
    at_limit = sized(empty_bytes_elements, LIMIT)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with running_gateway() as gateway:
        address = gateway.server.listeners["grpc"]
        live = Liveness(gateway.session, gateway.url)
        async with (
            ArmedLoop(stall_limit=1.0) as armed,
            live.polling(),
            grpc.aio.insecure_channel(address, options=options) as channel,
        ):
            victim = asyncio.create_task(victim_chat_gap(gateway.session, gateway.url, 200))
            infer = channel.unary_unary(MODEL_INFER)
            codes = [
                await _status(infer(message, timeout=60)) for message in (huge, at_limit, huge)
            ]
            stream = channel.stream_stream(MODEL_STREAM_INFER)(iter([huge]), timeout=60)
            codes.append(await _status(stream.read()))
            longest_gap = await victim
    armed.check()
    live.check()
    assert longest_gap < 1.0, f"the victim's chat stream stood {longest_gap:.2f} s"
    exhausted, invalid = "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"
    assert codes == [exhausted, invalid, exhausted, exhausted]


async def _status(answer: Awaitable[Any]) -> str:
    """The call's status code, or ``answered`` when it answered."""
    try:
        await answer
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    return "answered"


# -- streams against a gateway process ----------------------------------------------------------


@pytest.fixture
def live_gateway(tmp_path: Path) -> Iterator[Process]:
    args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0"]
    with spawn("gateway_server", args, tmp_path) as process:
        yield process
        process.terminate()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def _write_all(call: Any, messages: Iterator[bytes]) -> None:
    for message in messages:
        await call.write(message)


async def _engine_requests(session: aiohttp.ClientSession, url: str, call_id: str) -> int:
    async with session.get(f"{url}/v2/requests") as r:
        calls = (await r.json())["requests"]
    return sum(c["engine_requests"] for c in calls if c["request_id"] == call_id)


async def test_a_stream_that_never_reads_its_responses_holds_little_and_nobody_waits(
    live_gateway: Process,
) -> None:
    """Ten requests with 1 MiB ids, then 200 with the longest id allowed, every one streaming
    60 tokens, and not one response read: the ids are refused, the rest wait in gRPC's flow
    control, and the gateway's memory and engine stay free for others."""
    pid, url, call_id = live_gateway.popen.pid, live_gateway.url(), "unread-stream"
    huge = [request_bytes(f"{i}" * MIB, stream=True, max_tokens=60) for i in range(10)]
    valid = (request_bytes(f"{i:0128d}", stream=True, max_tokens=60) for i in range(200))
    before = rss_mib(pid)
    growth, most_requests = 0.0, 0
    async with (
        aiohttp.ClientSession() as session,
        Liveness(session, url).polling() as live,
        grpc.aio.insecure_channel(live_gateway.listeners["grpc"]) as channel,
    ):
        call = channel.stream_stream(MODEL_STREAM_INFER)(
            metadata=(("x-request-id", call_id),), timeout=120
        )
        writer = asyncio.create_task(_write_all(call, iter([*huge, *valid])))
        victim = None
        started = time.monotonic()
        while time.monotonic() - started < 6 and growth < 512:
            await asyncio.sleep(0.2)
            growth = max(growth, rss_mib(pid) - before)
            most_requests = max(most_requests, await _engine_requests(session, url, call_id))
            if victim is None and time.monotonic() - started > 2:
                victim = asyncio.create_task(victim_completion(session, url))
        waited = await victim if victim is not None else float("inf")
        writer.cancel()
        call.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    assert growth < 64, f"the gateway's memory grew {growth:.0f} MiB for a stream nobody reads"
    assert waited < 5, f"a victim's 5-token completion took {waited:.1f} s"
    assert 0 < most_requests <= 16, most_requests
    logged = live_gateway.log_path.stat().st_size
    assert logged < MIB, f"the gateway logged {logged:,} bytes: ids cut or refused, not whole"
    live.check()


UNREAD_BUFFER = 32 * 1024
UNREAD_TOKENS = 4000


@pytest.fixture
def fast_gateway(tmp_path: Path) -> Iterator[Process]:
    """20 slots (16 for the stream, room for a victim), 1 ms steps; a stream buffer of 32 KiB."""
    args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", "--sim-slots", "20",
            "--sim-step-base", "0.001", "--sim-step-per-seq", "0",
            "--grpc-stream-buffer-bytes", str(UNREAD_BUFFER)]  # fmt: skip
    with spawn("gateway_server", args, tmp_path) as process:
        yield process
        process.terminate()


async def _taken(session: aiohttp.ClientSession, url: str, call_id: str) -> int:
    """Tokens the call's requests have taken from the engine so far."""
    calls = await _calls_in_flight(session, url)
    return sum(c["generated_tokens"] for c in calls if c["request_id"] == call_id)


async def test_an_unread_stream_merges_its_tokens_within_its_buffers_bytes_then_waits(
    fast_gateway: Process,
) -> None:
    """16 requests of 4,000 tokens (ids of 128 characters: a response's own bytes are ~330) on
    a stream whose client reads nothing. Its tokens merge while they wait (unmerged, ~100
    responses fill 32 KiB: measured, the requests waited after ~110 tokens), but their bytes
    still count: once the buffer is full the requests take no more tokens (at most ~16,000 of
    the vocabulary's shortest, 2 bytes; measured ~4,500; merging that ignored the limit would take
    all 64,000), the gateway's memory stays flat and a victim is served. Read at last, every
    token arrives once."""
    pid, url, call_id = fast_gateway.popen.pid, fast_gateway.url(), "unread-merging"
    asks = [request_bytes(f"{i:0128d}", stream=True, max_tokens=UNREAD_TOKENS) for i in range(16)]
    small_window = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    before = rss_mib(pid)
    async with (
        aiohttp.ClientSession() as session,
        Liveness(session, url).polling() as live,
        grpc.aio.insecure_channel(fast_gateway.listeners["grpc"], options=small_window) as channel,
    ):
        call = channel.stream_stream(MODEL_STREAM_INFER)(
            metadata=(("x-request-id", call_id),), timeout=120
        )
        await _write_all(call, iter(asks))
        await call.done_writing()
        seen: list[tuple[float, int]] = []

        async def settled() -> bool:  # the same count for half a second
            now = time.monotonic()
            seen.append((now, await _taken(session, url, call_id)))
            older = [n for t, n in seen if t <= now - 0.5]
            return bool(older) and older[-1] == seen[-1][1] > 0

        await wait_until(settled, within=60, what="the unread stream's requests to wait")
        growth = rss_mib(pid) - before
        waited = await victim_completion(session, url)
        texts: dict[str, list[str]] = {}
        while (raw := await call.read()) is not grpc.aio.EOF:
            response = pb.ModelStreamInferResponse.FromString(raw).infer_response
            (element,) = decode_bytes_tensor(response.raw_output_contents[0], "text_output")
            texts.setdefault(response.id, []).append(element.decode())
    taken = seen[-1][1]
    assert 1000 < taken < 16 * UNREAD_TOKENS // 4, f"{taken} tokens taken for a 32 KiB buffer"
    assert growth < 64, f"the gateway's memory grew {growth:.0f} MiB for a stream nobody reads"
    assert waited < 5, f"a victim's 5-token completion took {waited:.1f} s"
    assert len(texts) == 16 and all(
        len("".join(t).split()) == UNREAD_TOKENS for t in texts.values()
    ), {k: len("".join(t).split()) for k, t in texts.items()}
    live.check()


async def test_a_stream_of_20000_requests_holds_16_at_a_time_and_nobody_waits(
    live_gateway: Process,
) -> None:
    pid, url, call_id = live_gateway.popen.pid, live_gateway.url(), "busy-stream"
    message = request_bytes("", stream=False, max_tokens=16)
    before = rss_mib(pid)
    async with (
        aiohttp.ClientSession() as session,
        Liveness(session, url).polling() as live,
        grpc.aio.insecure_channel(live_gateway.listeners["grpc"]) as channel,
    ):
        call = channel.stream_stream(MODEL_STREAM_INFER)(
            metadata=(("x-request-id", call_id),), timeout=120
        )
        answers: list[Any] = []

        async def read() -> None:
            while (answer := await call.read()) is not grpc.aio.EOF:
                answers.append(len(answer))

        clients = [
            asyncio.create_task(_write_all(call, (message for _ in range(20_000)))),
            asyncio.create_task(read()),
        ]
        samples = []
        for _ in range(5):
            await asyncio.sleep(0.2)
            samples.append(await _engine_requests(session, url, call_id))
        waited = await victim_completion(session, url)
        samples.append(await _engine_requests(session, url, call_id))
        growth = rss_mib(pid) - before
        for task in clients:
            task.cancel()
        call.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    assert waited < 5, f"a victim's 5-token completion took {waited:.1f} s"
    assert max(samples) <= 16 and answers, (samples, len(answers))
    assert growth < 64, f"the gateway's memory grew {growth:.0f} MiB"
    live.check()


# -- many streams at once ------------------------------------------------------------------------

FLOODER = (("x-forwarded-for", "203.0.113.9, 10.0.0.1"),)
"""Two clients on one loopback host: the header as the sidecar writes it (the last element is
the address it saw), which the gateway reads with --client-header as the chart has it; a
gateway reached directly tells clients apart by their address the same way."""
VICTIM = (("x-forwarded-for", "10.0.0.2"),)
REFUSED = "hangup_gateway_calls_refused_total"


@pytest.fixture
def shared_gateway(tmp_path: Path) -> Iterator[Process]:
    """A gateway with its default call limits, telling clients apart as behind the sidecar."""
    args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0", "--sim-step-base",
            "0.002", "--client-header", "x-forwarded-for"]  # fmt: skip
    with spawn("gateway_server", args, tmp_path) as process:
        yield process
        process.terminate()


async def _refused(session: aiohttp.ClientSession, url: str, reason: str) -> float:
    return total(await scrape_async(session, url), REFUSED, listener="grpc", reason=reason)


async def _victim_infer(channel: grpc.aio.Channel) -> float:
    """Seconds a victim's 5-token ModelInfer took; fails unless answered within 10 s."""
    started = time.monotonic()
    infer = channel.unary_unary(MODEL_INFER)
    await infer(request_bytes("victim", stream=False, max_tokens=5), metadata=VICTIM, timeout=10)
    return time.monotonic() - started


async def _calls_in_flight(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/v2/requests") as r:
        return list((await r.json())["requests"])


async def _grpc_calls(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    return [c for c in await _calls_in_flight(session, url) if c["protocol"] == "kserve_grpc"]


async def test_one_clients_streams_past_its_share_are_refused_and_another_is_served(
    shared_gateway: Process,
) -> None:
    """300 ModelStreamInfer streams of one client, 16 requests each (4,800 engine requests:
    on main every one was taken, each stream a place of 16 requests and 256 KiB of responses,
    with no bound on how many streams). Now the client holds --grpc-max-calls-per-client (256)
    and the other 44 are RESOURCE_EXHAUSTED before a message is read, counted; another client's
    call is served beside them, and liveness never fails."""
    url = shared_gateway.url()
    message = request_bytes("", stream=False, max_tokens=50)
    async with (
        aiohttp.ClientSession() as session,
        Liveness(session, url).polling() as live,
        grpc.aio.insecure_channel(shared_gateway.listeners["grpc"]) as channel,
    ):
        stream = channel.stream_stream(MODEL_STREAM_INFER)
        calls = [stream(metadata=FLOODER, timeout=120) for _ in range(300)]
        writers = [asyncio.create_task(_write_all(c, iter([message] * 16))) for c in calls]

        async def settled() -> bool:  # every stream taken or refused
            streams = await _grpc_calls(session, url)
            return len(streams) + sum(c.done() for c in calls) >= len(calls)

        await wait_until(settled, within=30, what="every stream taken or refused")
        waited = await _victim_infer(channel)
        streams = await _grpc_calls(session, url)
        refused = await _refused(session, url, "too_many_client_calls")
        ended = [c for c in calls if c.done()]
        codes = {(await c.code()).name for c in ended}
        detail = await ended[0].details() if ended else ""
        for call in calls:
            call.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
    assert (refused, len(ended), codes) == (44, 44, {"RESOURCE_EXHAUSTED"}), len(streams)
    assert "--grpc-max-calls-per-client" in detail, detail
    assert len(streams) == 256 and sum(c["engine_requests"] for c in streams) <= 256 * 16
    assert waited < 5, f"another client's 5-token ModelInfer took {waited:.1f} s"
    live.check()


async def test_past_the_listeners_calls_a_call_is_refused_and_a_cancel_still_served(
    shared_gateway: Process,
) -> None:
    """1,024 streams that send nothing (the default --grpc-max-calls), from eight clients of
    128 each (within their share), over two connections: the next call, from a ninth client, is
    RESOURCE_EXHAUSTED (on main it was taken, and the next and the next); a cancel is still
    served, and once the streams end a call is taken again."""
    url, address = shared_gateway.url(), shared_gateway.listeners["grpc"]
    late = request_bytes("late", stream=False, max_tokens=1)
    ninth = (("x-forwarded-for", "10.0.2.1"),)
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    async with (
        aiohttp.ClientSession() as session,
        Liveness(session, url).polling() as live,
        grpc.aio.insecure_channel(address) as one,
        grpc.aio.insecure_channel(address, options=own_connection) as two,
    ):
        held = [
            channel.stream_stream(MODEL_STREAM_INFER)(
                metadata=(("x-forwarded-for", f"10.0.1.{n % 8}"),), timeout=120
            )
            for n, channel in enumerate([one, two] * 512)
        ]

        async def opened() -> bool:
            return len(await _calls_in_flight(session, url)) == 1024

        await wait_until(opened, within=30, what="1,024 streams in flight")
        infer = two.unary_unary(MODEL_INFER)
        code = await _status(infer(late, metadata=ninth, timeout=10))
        cancel = one.unary_unary("/hangup.v1.Cancellation/Cancel")
        asked = cancellation_pb2.CancelRequest(request_id="never-seen").SerializeToString()
        cancelled = await _status(cancel(asked, timeout=10))
        refused = await _refused(session, url, "too_many_calls")
        early = [c for c in held if c.done()]
        for call in held:
            call.cancel()

        async def none_left() -> bool:
            return not await _calls_in_flight(session, url)

        await wait_until(none_left, within=30, what="the streams ended")
        again = await _status(infer(late, metadata=ninth, timeout=10))
    assert not early, f"{len(early)} of the 1,024 streams ended early"
    assert (code, refused, again) == ("RESOURCE_EXHAUSTED", 1, "answered"), (code, refused, again)
    assert cancelled == "NOT_FOUND", cancelled  # answered, not refused
    live.check(probes=1)
