"""The gateway's KServe v2 gRPC surface next to a real Triton's, call by call, read with Triton's
own client protos (``tritonclient.grpc``).

As on HTTP (``test_triton_parity.py``), Triton serves the streamer model and the gateway its
simulated engine under the same name. Texts differ; what a client relies on must not: a stream's
responses in order (outputs, ``triton_final_response``, the empty final response when asked for
with ``triton_enable_empty_final_response``), errors in the stream's ``error_message`` or as the
call's status code, and the other calls' status codes and fields. Where the gateway differs on
purpose the case says why; the table in docs/triton-parity.md (its gRPC part) is kept by the test
(``HANGUP_WRITE_PARITY=1`` rewrites it)."""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as service
from google.protobuf.json_format import MessageToDict

from bench.base.processes import Process
from bench.harness.triton.io import inputs, is_final, text_of
from bench.harness.triton.server import TritonServer
from tests.triton.test_triton_parity import MODEL, contained, kept_current

pytestmark = pytest.mark.slow

TABLE_START, TABLE_END = "<!-- grpc parity table: start -->", "<!-- grpc parity table: end -->"
EXTRA = "same, and each response names its `hangup_request_id` (the id the cancel API takes)"


def text(value: str) -> bytes:
    """One BYTES element as Triton lays it out in ``raw_input_contents``."""
    raw = value.encode()
    return len(raw).to_bytes(4, "little") + raw


def request(
    prompt: object = "hi",
    *,
    stream: bool = True,
    max_tokens: int = 3,
    model: str = MODEL,
    datatype: str = "BYTES",
    name: str = "text_input",
    empty_final: bool = False,
    id: str = "parity",
) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=id)
    message.inputs.add(name=name, datatype=datatype, shape=[1])
    raw = text(str(prompt)) if datatype == "BYTES" else np.array([prompt], np.int32).tobytes()
    message.inputs.add(name="stream", datatype="BOOL", shape=[1])
    message.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    sampling = text(json.dumps({"max_tokens": max_tokens}))
    message.raw_input_contents.extend([raw, bytes([stream]), sampling])
    if empty_final:
        message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def shaped(message: pb.ModelInferRequest, shape: list[int]) -> pb.ModelInferRequest:
    """``message`` with ``text_input`` (its first input) of ``shape``."""
    message.inputs[0].ClearField("shape")
    message.inputs[0].shape.extend(shape)
    return message


def raw_text(message: pb.ModelInferRequest, raw: bytes) -> pb.ModelInferRequest:
    """``message`` with ``text_input``'s raw contents replaced by ``raw``."""
    message.raw_input_contents[0] = raw
    return message


@dataclass(frozen=True)
class Case:
    name: str
    call: str  # the service's method
    message: Any
    kept: str = ""  # why the gateway differs on purpose ("": it must not)


CASES = [
    Case("server live", "ServerLive", pb.ServerLiveRequest()),
    Case("server ready", "ServerReady", pb.ServerReadyRequest()),
    Case("server metadata", "ServerMetadata", pb.ServerMetadataRequest()),
    Case("model ready", "ModelReady", pb.ModelReadyRequest(name=MODEL)),
    Case("model ready, unknown model", "ModelReady", pb.ModelReadyRequest(name="nope")),
    Case("model metadata", "ModelMetadata", pb.ModelMetadataRequest(name=MODEL)),
    Case("model metadata, version 1", "ModelMetadata",
         pb.ModelMetadataRequest(name=MODEL, version="1")),
    Case("model metadata, unknown model", "ModelMetadata", pb.ModelMetadataRequest(name="nope")),
    Case("model config", "ModelConfig", pb.ModelConfigRequest(name=MODEL)),
    Case("repository index", "RepositoryIndex", pb.RepositoryIndexRequest()),
    Case("stream: streamed tokens", "ModelStreamInfer", [request()]),
    Case("stream: one answer", "ModelStreamInfer", [request(stream=False)]),
    Case("stream: two requests", "ModelStreamInfer",
         [request(id="a"), request(stream=False, id="b")]),
    Case("stream: unknown model", "ModelStreamInfer", [request(model="nope")]),
    Case("stream: unknown input", "ModelStreamInfer", [request(name="prompt")]),
    Case("stream: wrong datatype", "ModelStreamInfer", [request(5, datatype="INT32")]),
    Case("stream: text_input of shape [2]", "ModelStreamInfer", [shaped(request(), [2])]),
    Case("stream: text_input of two elements", "ModelStreamInfer",
         [raw_text(request(), text("a") + text("b"))]),
    Case("stream: text_input of no element", "ModelStreamInfer", [raw_text(request(), b"")]),
    Case("stream: text_input cut in its length", "ModelStreamInfer",
         [raw_text(request(), b"\x05\x00")]),
    Case("stream: an id of 128 characters", "ModelStreamInfer",
         [request(id="a request / " + "x" * 116)]),
    Case("stream: an id of 129 characters", "ModelStreamInfer", [request(id="x" * 129)],
         kept="refused in the stream (INVALID_ARGUMENT) before it runs: Triton takes an id of "
              "any length and repeats it in every response (a 262 KB request, 105 MB of "
              "responses); the gateway takes any string of up to 128 characters"),
    Case("stream: streamed, empty final asked for", "ModelStreamInfer",
         [request(empty_final=True)],
         kept="the gateway ends each request with an empty final response when asked for one; "
              "the streamer model flags its last token final, so Triton sends none (a client "
              "that asks for it must take either)"),
    Case("stream: max_tokens 0", "ModelStreamInfer", [request(max_tokens=0)],
         kept="refused in the stream naming `max_tokens`, as vLLM refuses it; Triton's model "
              "answers nothing, and without the empty final its client never hears the end"),
    Case("stream: two requests, one id", "ModelStreamInfer",
         [request(), request(stream=False)],
         kept="the second is refused in the stream (ALREADY_EXISTS) while the first is in "
              "flight: the cancel API finds a request by its id"),
    Case("infer on the decoupled model", "ModelInfer", request(stream=False),
         kept="Triton refuses ModelInfer on a decoupled model (UNIMPLEMENTED); the gateway "
              "answers the whole text in one response, the simplest call with a deadline"),
]  # fmt: skip


def response_shape(message: Any) -> Any:
    """A stream response as a client reads it: its error, or its outputs (name, datatype, rank)
    and its parameters' names with ``triton_final_response``'s value."""
    if message.error_message:
        return {"error": "message"}
    response = message.infer_response
    parameters = dict(response.parameters)
    final = parameters.get("triton_final_response")
    return {
        "outputs": sorted((o.name, o.datatype, len(o.shape)) for o in response.outputs),
        "parameters": sorted(parameters),
        "final": None if final is None else final.bool_param,
    }


def message_shape(message: Any) -> Any:
    """A unary answer's fields and their kinds (values differ between servers)."""

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: shape(v) for k, v in sorted(value.items())}
        if isinstance(value, list):
            return [shape(value[0])] if value else []
        return type(value).__name__

    return shape(MessageToDict(message))


async def read(address: str, case: Case) -> tuple[str, Any]:
    """(the call's status code, what it answered) for ``case`` at ``address``."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service.GRPCInferenceServiceStub(channel)
        method: Callable[..., Any] = getattr(stub, case.call)
        try:
            async with asyncio.timeout(20):
                if case.call != "ModelStreamInfer":
                    return "OK", message_shape(await method(case.message))
                responses = []
                async for message in method(_requests(case.message)):
                    responses.append(response_shape(message))
                return "OK", responses
        except grpc.aio.AioRpcError as exc:
            return exc.code().name, None


async def _requests(messages: list[Any]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


def alike(theirs: tuple[str, Any], ours: tuple[str, Any]) -> bool:
    """The same status and answers; a stream's responses may name more parameters, a unary
    answer may have fewer fields (Triton's model config has many more)."""
    if theirs[0] != ours[0]:
        return False
    if not isinstance(theirs[1], list) or not isinstance(ours[1], list):
        return bool(theirs[1] == ours[1] or contained(ours[1], theirs[1]))
    their_runs, our_runs = text_runs(theirs[1]), text_runs(ours[1])
    return len(their_runs) == len(our_runs) and all(
        _response_alike(t, o) for t, o in zip(their_runs, our_runs, strict=True)
    )


def text_runs(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``responses`` with each run of text responses as one. Once its writer has fallen behind,
    the gateway sends a request's waiting tokens as one response (DESIGN.md's "Streams that fall
    behind"; seen here under a load of 6: two responses for Triton's three), so how many
    responses a run takes is the machine's, not the server's shape. A run ends with a final
    response; it keeps its last response's flag and every parameter its responses named. An
    error or an empty final response is never part of a run."""
    runs: list[dict[str, Any]] = []
    for response in responses:
        last = runs[-1] if runs else None
        if (last is not None and response.get("outputs") and last.get("final") is False
                and last.get("outputs") == response["outputs"]):  # fmt: skip
            named = sorted(set(last["parameters"]) | set(response["parameters"]))
            runs[-1] = {**response, "parameters": named}
        else:
            runs.append(response)
    return runs


def _response_alike(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    rest = {k: v for k, v in ours.items() if k != "parameters"}
    if rest != {k: v for k, v in theirs.items() if k != "parameters"}:
        return False
    return set(theirs.get("parameters", [])) <= set(ours.get("parameters", []))


async def test_the_gateway_streams_and_answers_in_triton_shapes(
    triton: TritonServer, sim_gateway: Process
) -> None:
    rows, failures = [], []
    for case in CASES:
        theirs = await read(triton.grpc, case)
        ours = await read(sim_gateway.listeners["grpc"], case)
        same = alike(theirs, ours)
        if same and case.kept:
            failures.append(f"{case.name}: now the same as Triton; drop its reason")
        if not same and not case.kept:
            failures.append(f"{case.name}:\n  Triton  {theirs}\n  gateway {ours}")
        verdict = f"differs: {case.kept}" if case.kept else "same" if theirs == ours else EXTRA
        if case.call == "ModelConfig" and same:
            verdict = "same fields (Triton's configuration has more)"
        rows.append(f"| {case.call} | {case.name} | {theirs[0]}, {_count(theirs)} "
                    f"| {ours[0]}, {_count(ours)} | {verdict} |")  # fmt: skip
    assert not failures, "\n".join(failures)
    table = "\n".join(["| call | case | Triton 2.51 | gateway | outcome |",
                       "|---|---|---|---|---|", *rows])  # fmt: skip
    kept_current(table, TABLE_START, TABLE_END)


def _count(reading: tuple[str, Any]) -> str:
    """What a reading holds, for the table: a unary answer, or a stream's :func:`text_runs`."""
    if not isinstance(reading[1], list):
        return "one answer" if reading[1] is not None else "no answer"
    return "; ".join(_run_name(run) for run in text_runs(reading[1])) or "no response"


def _run_name(run: dict[str, Any]) -> str:
    if "error" in run:
        return "an error"
    if not run.get("outputs"):
        return "an empty final response" if run.get("final") else "an empty response"
    return "text (final)" if run.get("final") else "text (not final)"


@pytest.mark.parametrize("target", ["triton", "sim_gateway"])
def test_tritonclient_streams_from_both_servers(
    request: pytest.FixtureRequest, target: str
) -> None:
    """``tritonclient.grpc``'s own stream (callbacks, the empty final response asked for):
    tokens, then the request's end, from Triton and from the gateway alike."""
    server: TritonServer | Process = request.getfixturevalue(target)
    address = server.grpc if isinstance(server, TritonServer) else server.listeners["grpc"]
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(address)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, inputs("hi", max_tokens=3), request_id="r1",
                                  enable_empty_final_response=True)  # fmt: skip
        texts, final = [], False
        while not final:
            result, error = results.get(timeout=20)
            assert error is None, error
            final = is_final(result)
            texts.append(text_of(result))
        client.stop_stream()
    finally:
        client.close()
    tokens = [t for t in texts if t is not None]
    assert len(tokens) == 3 and all(tokens), texts
