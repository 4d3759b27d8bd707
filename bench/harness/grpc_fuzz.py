"""A bounded, seeded mutation fuzzer of gRPC messages for the live processes.

``cases(seed, n)`` picks a method the gateway serves (every ``inference.GRPCInferenceService``
method, unary and ``ModelStreamInfer``; ``hangup.v1.Cancellation/Cancel``; health; one that does
not exist) and sends it messages that are random bytes, a well-formed message with flipped bits,
cut or spliced, a well-formed ``ModelInferRequest`` whose fields are odd (unknown inputs, wrong
datatypes, shapes, contents in both places, raw contents with broken length prefixes, odd
parameters and sampling JSON), a large message, or the message unchanged; a stream gets one to
four of them. Metadata is sometimes a malformed ``x-request-id`` or a cancel token.
``send(channel, case)`` makes the call and reads every response.

What a server may answer: a status a client can act on (OK, INVALID_ARGUMENT, NOT_FOUND, ...)
and, on a stream, responses whose ``error_message`` names a client error. ``UNKNOWN``,
``INTERNAL``, ``DATA_LOSS`` or ``UNAVAILABLE`` (both processes are up throughout) is a finding,
and so is a stream error message that starts with one of them.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2

from bench.harness.stack import MODEL, TOKEN
from hangup_contract.protos import cancellation_pb2
from hangup_contract.protos import inference_pb2 as pb
from proxy.grpc.status import StatusWatch

INFERENCE = "/inference.GRPCInferenceService/"
STREAM = INFERENCE + "ModelStreamInfer"
DEADLINE = 8.0
FINDINGS = ("UNKNOWN", "INTERNAL", "DATA_LOSS", "UNAVAILABLE")


def infer_request(
    prompt: str = "Once", *, stream: bool = True, **sampling: object
) -> pb.ModelInferRequest:
    """A well-formed ``ModelInferRequest`` for the model, as Triton's clients build it."""
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    params = json.dumps({"max_tokens": 4, **sampling}).encode()
    request.raw_input_contents.extend(
        [_bytes_tensor([prompt.encode()]), bytes([stream]), _bytes_tensor([params])]
    )
    return request


def _bytes_tensor(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


SEEDS: list[tuple[str, bool, bytes]] = [  # (method, streaming, a well-formed message)
    (INFERENCE + "ServerLive", False, pb.ServerLiveRequest().SerializeToString()),
    (INFERENCE + "ServerReady", False, pb.ServerReadyRequest().SerializeToString()),
    (INFERENCE + "ModelReady", False, pb.ModelReadyRequest(name=MODEL).SerializeToString()),
    (INFERENCE + "ServerMetadata", False, pb.ServerMetadataRequest().SerializeToString()),
    (INFERENCE + "ModelMetadata", False, pb.ModelMetadataRequest(name=MODEL).SerializeToString()),
    (INFERENCE + "ModelConfig", False, pb.ModelConfigRequest(name=MODEL).SerializeToString()),
    (INFERENCE + "ModelInfer", False, infer_request(stream=False).SerializeToString()),
    (STREAM, True, infer_request().SerializeToString()),
    (STREAM, True, infer_request(stream=False).SerializeToString()),
    ("/hangup.v1.Cancellation/Cancel", False,
     cancellation_pb2.CancelRequest(request_id="some-id").SerializeToString()),
    ("/grpc.health.v1.Health/Check", False, health_pb2.HealthCheckRequest().SerializeToString()),
    (INFERENCE + "NoSuchMethod", False, b""),
]  # fmt: skip
_NAMES = ["text_input", "stream", "sampling_parameters", "exclude_input_in_output", "x", ""]
_TYPES = ["BYTES", "BOOL", "INT32", "FP32", "UINT8", "", "WAT"]
_SHAPES = [[1], [1], [0], [2], [-1], [1 << 40], [], [1, 1]]
_SAMPLING = [
    b'{"max_tokens": 4}', b'{"max_tokens": -1}', b'{"max_tokens": 1e9}', b'{"max_tokens": "4"}',
    b'{"temperature": -3}', b'{"top_p": 2}', b'{"seed": 1.5}', b'{"stop": [1, 2]}', b"[]", b"{",
    b"null", b'"x"', b"\xff\xfe", b'{"max_tokens": 4, "ignore_eos": "yes"}', b"",
]  # fmt: skip
_PARAMETERS = ["triton_enable_empty_final_response", "sequence_id", "sequence_start",
               "sequence_end", "max_tokens", "priority", ""]  # fmt: skip


@dataclass
class Case:
    method: str
    streaming: bool
    messages: list[bytes]
    metadata: list[tuple[str, str]]
    mutation: str


@dataclass
class Answer:
    code: str  # the call's final status code's name
    details: str
    stream_errors: list[str] = field(default_factory=list)
    texts: list[bytes] = field(default_factory=list)

    def findings(self) -> list[str]:
        found = [f"{self.code}: {self.details}"] if self.code in FINDINGS else []
        return found + [e for e in self.stream_errors if e.startswith(FINDINGS)]


def _odd_infer_request(rng: random.Random) -> bytes:
    request = pb.ModelInferRequest(
        model_name=rng.choice([MODEL, MODEL, "", "nope", "m" * 300, MODEL + "\x00"]),
        model_version=rng.choice(["", "", "1", "-1", "abc"]),
        id=rng.choice(["", "", "7", "x" * 500, "é ü", "a/b"]),
    )
    for _ in range(rng.randint(0, 5)):
        tensor = request.inputs.add(
            name=rng.choice(_NAMES), datatype=rng.choice(_TYPES), shape=rng.choice(_SHAPES)
        )
        where = rng.choice(["raw", "raw", "bytes", "bool", "int", "none"])
        if where == "raw":
            request.raw_input_contents.append(_odd_raw(rng))
        elif where == "bytes":
            tensor.contents.bytes_contents.extend(
                [rng.choice([*_SAMPLING, b"Once"]) for _ in range(rng.randint(0, 3))]
            )
        elif where == "bool":
            tensor.contents.bool_contents.extend([rng.random() < 0.5] * rng.randint(0, 3))
        elif where == "int":
            tensor.contents.int_contents.extend([rng.randint(-(2**31), 2**31 - 1)])
    for _ in range(rng.randint(0, 2)):
        parameter = request.parameters[rng.choice(_PARAMETERS)]
        kind = rng.choice(["bool_param", "int64_param", "string_param", "double_param"])
        value = {
            "bool_param": rng.random() < 0.5, "int64_param": rng.randint(-5, 2**62),
            "string_param": rng.choice(["", "x", "1"]), "double_param": rng.random(),
        }[kind]  # fmt: skip
        setattr(parameter, kind, value)
    if rng.random() < 0.2:
        request.outputs.add(name=rng.choice(["text_output", "nope"]))
    return request.SerializeToString()


def _odd_raw(rng: random.Random) -> bytes:
    choice = rng.randint(0, 4)
    if choice == 0:
        return _bytes_tensor([rng.choice([*_SAMPLING, b"Once"])])
    if choice == 1:  # a length prefix longer than the data
        return struct.pack("<I", rng.randint(5, 2**32 - 1)) + b"abcd"
    if choice == 2:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 7)))
    if choice == 3:
        return bytes([rng.randint(0, 255)])
    return b""


def _mutate(rng: random.Random, message: bytes, method: str) -> tuple[bytes, str]:
    kind = rng.choice(["keep", "random", "flip", "cut", "splice", "odd", "odd", "odd", "large"])
    if kind == "random":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 256))), kind
    if kind == "flip" and message:
        data = bytearray(message)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), kind
    if kind == "cut" and message:
        return message[: rng.randrange(len(message))], kind
    if kind == "splice":
        return message + rng.choice(SEEDS)[2], kind
    if kind == "odd" and "Infer" in method:
        return _odd_infer_request(rng), kind
    if kind == "large":
        prompt = "x " * rng.randint(100_000, 1_000_000)
        return infer_request(prompt).SerializeToString(), kind
    return message, "keep"


def _metadata(rng: random.Random, method: str) -> list[tuple[str, str]]:
    metadata = []
    if method.endswith("/Cancel") and rng.random() < 0.7:
        metadata.append(("authorization", rng.choice([f"Bearer {TOKEN}", "Bearer nope", "x"])))
    if rng.random() < 0.15:
        value = rng.choice(["ok-id", "a b", "../x", "x" * 200, "", "é"])
        metadata.append(("x-request-id", value.encode("ascii", "replace").decode()))
    return metadata


def _case(rng: random.Random) -> Case:
    method, streaming, seed = rng.choice(SEEDS)
    count = rng.randint(1, 4) if streaming else 1
    mutated = [_mutate(rng, seed, method) for _ in range(count)]
    kinds = ",".join(kind for _, kind in mutated)
    return Case(method, streaming, [m for m, _ in mutated], _metadata(rng, method),
                f"{method.rsplit('/', 1)[1]} [{kinds}]")  # fmt: skip


def cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    return [_case(rng) for _ in range(n)]


async def send(channel: grpc.aio.Channel, case: Case) -> Answer:
    """Make the call (bytes in, bytes out) and read every response; never raises for a status."""
    if not case.streaming:
        try:
            await channel.unary_unary(case.method)(
                case.messages[0], metadata=case.metadata, timeout=DEADLINE
            )
        except grpc.aio.AioRpcError as exc:
            return Answer(exc.code().name, exc.details() or "")
        return Answer("OK", "")
    answer = Answer("OK", "")
    call = channel.stream_stream(case.method)(
        iter(case.messages), metadata=case.metadata, timeout=DEADLINE
    )
    # A server that ends the stream before reading every message races this client's own
    # writes, and grpc.aio stamps such a call INTERNAL: read what the server sent instead.
    watch = StatusWatch(call)
    try:
        async for raw in call:
            response = pb.ModelStreamInferResponse.FromString(raw)
            if response.error_message:
                answer.stream_errors.append(response.error_message)
            answer.texts.extend(response.infer_response.raw_output_contents)
    except grpc.aio.AioRpcError as exc:
        code, details, _ = await watch.status(exc.code(), exc.details(), ())
        return Answer(code.name, details or "")
    return answer


def stream_text(answer: Answer) -> bytes:
    return b"".join(answer.texts)
