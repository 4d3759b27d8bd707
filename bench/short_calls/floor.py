"""Benchmark: how far hangup's per-call CPU is from the least a Python relay can spend.

Kept-alive short calls (``bench.short_calls.load``: 1 KiB JSON in and out, an upstream that
answers at once, 16 client loops), no CPU quota, one process each, in one run:

- **the floor**: a relay of a few dozen lines, written here (:class:`_FloorDown`), that does
  what no relay can skip and nothing else: uvloop, httptools parsing both ways, one upstream
  connection per client connection, the request forwarded with a fresh ``X-Request-Id``, the
  answer relayed as the bytes that came (no header rewriting, no limits, no metrics, no
  hang-up handling). It is a measuring stick, not a proxy;
- **the floor with a task per call**: the same, each call run by a task through three nested
  coroutines that await the upstream's answer (what an asyncio handler structure costs);
- **hangup's proxy** (``--workers 1``) and **Envoy** (``--concurrency 1``).

``--triton``: the same question for the Triton bridge, in front of a real Triton
(``bench/harness/triton/server.py``) called as ``bench.short_calls.one_core`` calls it (the 1 KiB
body to the ``slow`` model with no steps, which answers at once):

- **the bridge floor**: a bridge of a few dozen lines, written here (:class:`_BridgeFloor`), that
  does the bridge's job with the least Python: uvloop and httptools for HTTP, a ``grpc.aio``
  channel to Triton's gRPC port, the JSON parsed by ``msgspec.json`` (in C, as the bridge reads
  it), each input packed with one ``struct.pack`` into a ``ModelInferRequest``, one
  ``ModelInfer`` call, the answer's outputs unpacked with one ``struct.unpack`` and written by
  ``msgspec.json`` in one call (its own number layout, not rapidjson's). FP32 only, no checks,
  no errors, no binary extension, no hang-up handling: a measuring stick, not a bridge;
- **the bridge floor on bytes**: the same server and channel with no conversion at all (the
  request's protobuf bytes built once, the gRPC answer not parsed, a fixed JSON answer written):
  what HTTP in and a ``grpc.aio`` call out cost, the floor of docs/benchmarks.md's "grpcio's own
  floor" measured in the same run;
- **hangup's Triton bridge** (``--cancel-adapter triton``, ``--workers 1``) and **Envoy**
  relaying HTTP to Triton's HTTP port (which cancels nothing).

Triton's own CPU is not counted. Prints the CPU µs per call for each, a line per round. Run:
``.venv/bin/python -m bench.short_calls.floor`` (about a minute; ``--triton``: about two; Envoy's
row is skipped when its binary is missing). The floor subprocesses are this module run with
``--floor UPSTREAM`` (``--bridge-floor GRPC``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httptools
import msgspec
import uvloop

from bench.base.addresses import host_port
from bench.base.processes import REPO
from bench.harness.envoy import find_envoy
from bench.harness.triton.server import install, running_triton
from bench.instruments.sse_source import sources
from bench.scaling.relays import envoy_relay, proxy_relay
from bench.short_calls.free import window
from bench.short_calls.load import BODY
from hangup_contract.protos import inference_pb2 as pb

# --- the floor relay (run in a process of its own) -------------------------------------------


class _FloorUp(asyncio.Protocol):
    """The upstream side of one client connection: an answer's bytes, handed on at its end."""

    def __init__(self, done: Callable[[bytes], None]) -> None:
        self._done = done
        self._parser = httptools.HttpResponseParser(self)
        self._parts: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._parts.append(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        answer = b"".join(self._parts)
        self._parts.clear()
        self._done(answer)


class _FloorDown(asyncio.Protocol):
    """One client connection: requests parsed, forwarded one at a time, answers written back."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)
    tasks = False  # run each call in a task (the second row)

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[bytes] = deque()
        self._busy = False
        self._up: _FloorUp | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[bytes] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._url = b""
        self._body = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._up is not None and self._up.transport is not None:
            self._up.transport.close()

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._body = b""

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        request = b"POST %b HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n" % (
            self._url
        ) + b"X-Request-Id: %b\r\nContent-Length: %d\r\n\r\n%b" % (
            os.urandom(16).hex().encode(),
            len(self._body),
            self._body,
        )
        if self.tasks:
            self._calls.add(asyncio.get_running_loop().create_task(self._serve(request)))
            return
        self._queue.append(request)
        self._pump()

    def _pump(self) -> None:
        if self._busy or not self._queue:
            return
        self._busy = True
        self._send(self._queue.popleft())

    def _send(self, request: bytes) -> None:
        if self._up is not None and self._up.transport is not None:
            self._up.transport.write(request)
            return
        loop = asyncio.get_running_loop()

        async def connect() -> None:
            _, self._up = await loop.create_connection(
                lambda: _FloorUp(self._answered), *self.upstream
            )
            assert self._up.transport is not None
            self._up.transport.write(request)

        self._connecting = loop.create_task(connect())

    def _answered(self, answer: bytes) -> None:
        if self._waiter is not None:
            self._waiter.set_result(answer)
            return
        assert self.transport is not None
        self.transport.write(answer)
        self._busy = False
        self._pump()

    async def _serve(self, request: bytes) -> None:  # three frames, as a handler's would be
        await self._handle(request)

    async def _handle(self, request: bytes) -> None:
        await self._relay(request)

    async def _relay(self, request: bytes) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        self._send(request)
        answer = await self._waiter
        self._waiter = None
        assert self.transport is not None
        self.transport.write(answer)
        self._calls.discard(asyncio.current_task())


async def _floor(upstream: str, tasks: bool) -> None:
    host, port = host_port(upstream)
    _FloorDown.upstream, _FloorDown.tasks = (host, port), tasks
    server = await asyncio.get_running_loop().create_server(_FloorDown, "127.0.0.1", 0)
    print(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# --- the bridge floor (run in a process of its own) ------------------------------------------

_TRITON_PATH = "/v2/models/slow/infer"
_READ = msgspec.json.Decoder().decode
_WRITE = msgspec.json.Encoder().encode
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


class _BridgeFloor(asyncio.Protocol):
    """One client connection: each request a task that makes one ``ModelInfer`` call."""

    infer: grpc.aio.UnaryUnaryMultiCallable  # set once the loop runs (see ``_bridge_floor``)
    convert = True  # False: prebuilt request bytes, the answer not parsed (the second row)
    prebuilt = b""  # the request's protobuf bytes, when not converting

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self._calls: set[asyncio.Task[None]] = set()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body, self._body = b"".join(self._body), []
        task = asyncio.get_running_loop().create_task(self._call(self._url, body))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, url: bytes, body: bytes) -> None:
        if not self.convert:
            await self.infer(self.prebuilt)
            answer = b'{"model_name":"slow","model_version":"1","outputs":[]}'
        else:
            answer = _converted(await self.infer(_request(url, body)))
        assert self.transport is not None
        self.transport.write(_HEAD % len(answer) + answer)


def _request(url: bytes, body: bytes) -> bytes:
    """The ``ModelInferRequest`` of a KServe v2 JSON call with FP32 inputs, serialized."""
    parsed = _READ(body)
    request = pb.ModelInferRequest(model_name=url.split(b"/")[3].decode())
    for key, value in parsed.get("parameters", {}).items():
        request.parameters[key].int64_param = value
    for tensor in parsed["inputs"]:
        data = tensor["data"]
        request.inputs.add(name=tensor["name"], datatype="FP32", shape=tensor["shape"])
        request.raw_input_contents.append(struct.pack(f"<{len(data)}f", *data))
    return request.SerializeToString()


def _converted(data: bytes) -> bytes:
    """A ``ModelInferResponse`` of FP32 outputs as KServe v2 JSON."""
    response = pb.ModelInferResponse.FromString(data)
    outputs = [
        {"name": output.name, "datatype": output.datatype, "shape": list(output.shape),
         "data": struct.unpack(f"<{len(raw) // 4}f", raw)}
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    ]  # fmt: skip
    answer = {"model_name": response.model_name, "model_version": response.model_version,
              "outputs": outputs}  # fmt: skip
    return _WRITE(answer)


async def _bridge_floor(target: str, convert: bool) -> None:
    channel = grpc.aio.insecure_channel(target)
    _BridgeFloor.infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=None,  # bytes both ways: the conversion is the floor's own
        response_deserializer=None,
    )
    _BridgeFloor.convert = convert
    _BridgeFloor.prebuilt = _request(_TRITON_PATH.encode(), BODY)
    server = await asyncio.get_running_loop().create_server(_BridgeFloor, "127.0.0.1", 0)
    print(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# --- the measurement -------------------------------------------------------------------------


Row = tuple[str, str, list[int]]


def _floor_process(stack: contextlib.ExitStack, argv: list[str]) -> tuple[str, list[int]]:
    """This module run as a floor (its address, its pid), stopped when ``stack`` closes."""
    floor = subprocess.Popen(
        [sys.executable, "-m", "bench.short_calls.floor", *argv],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    stack.callback(floor.wait)
    stack.callback(floor.kill)
    assert floor.stdout is not None
    return floor.stdout.readline().strip(), [floor.pid]


@contextlib.contextmanager
def _http_rows(work: Path) -> Iterator[tuple[list[Row], str]]:
    with contextlib.ExitStack() as stack:
        upstream, _ = stack.enter_context(sources(1, work))
        rows: list[Row] = []
        for name, extra in (("floor", []), ("floor, a task per call", ["--tasks"])):
            rows.append((name, *_floor_process(stack, ["--floor", upstream, *extra])))
        proxy = proxy_relay(stack, 1, upstream, work)
        rows.append(("hangup", proxy.address, [p for group in proxy.groups for p in group]))
        if find_envoy():
            envoy = envoy_relay(stack, 1, upstream, work, 0)
            rows.append(("Envoy", envoy.address, [p for group in envoy.groups for p in group]))
        yield rows, "/infer"


@contextlib.contextmanager
def _triton_rows(work: Path) -> Iterator[tuple[list[Row], str]]:
    found = install()
    if isinstance(found, str):
        raise SystemExit(f"no Triton to run: {found}")
    with (
        running_triton(work / f"triton-{time.monotonic_ns()}", found) as server,
        contextlib.ExitStack() as stack,
    ):
        rows: list[Row] = []
        for name, extra in (("bridge floor", []), ("bridge floor on bytes", ["--bytes"])):
            rows.append((name, *_floor_process(stack, ["--bridge-floor", server.grpc, *extra])))
        bridge = ["--cancel-adapter", "triton", "--upstream-grpc", server.grpc]
        proxy = proxy_relay(stack, 1, server.http, work, bridge)
        pids = [p for group in proxy.groups for p in group]
        rows.append(("hangup's Triton bridge", proxy.address, pids))
        if find_envoy():
            envoy = envoy_relay(stack, 1, server.http, work, 1)
            pids = [p for group in envoy.groups for p in group]
            rows.append(("Envoy (HTTP to Triton)", envoy.address, pids))
        yield rows, _TRITON_PATH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per row")
    parser.add_argument("--triton", action="store_true", help="the Triton bridge's floor")
    parser.add_argument("--floor", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bridge-floor", metavar="GRPC", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        uvloop.run(_floor(args.floor, args.tasks))
        return
    if args.bridge_floor:
        uvloop.run(_bridge_floor(args.bridge_floor, not args.bytes))
        return
    work = REPO / ".demo" / "bench-short-calls-floor"
    work.mkdir(parents=True, exist_ok=True)
    with (_triton_rows if args.triton else _http_rows)(work) as (rows, path):
        for _ in range(args.rounds):
            for name, address, pids in rows:
                output, cpu = window(address, True, 16, args.window, pids, path=path)
                calls, errors = int(str(output["calls"])), output["errors"]
                us = 1e6 * cpu / max(1, calls)
                rate = calls / args.window
                print(f"{name}: {us:.0f} µs of CPU per kept-alive call "
                      f"({rate:,.0f} calls/s, {errors} errors)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
