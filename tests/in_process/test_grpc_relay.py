"""The proxy's gRPC relay against a real gRPC upstream on loopback.

The upstream here is a small scripted gRPC server (``ScriptedUpstream``): it knows nothing of
hangup's gateway, which keeps the relay honest about being schema-agnostic. It serves a few raw
methods (echo, a failing one, one that hangs) and ``hangup.v1.Cancellation/Cancel``, and records
what it saw, in order, so tests can assert that the explicit cancel arrived and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from bench.base.processes import child_env
from bench.base.waiting import wait_until
from hangup_contract.cancel_labels import Reason
from hangup_contract.protos import cancellation_pb2
from proxy.calls.state import ServerState
from proxy.cancel.canceller import Canceller
from proxy.cancel.grpc import GrpcCancelAdapter
from proxy.config import Config
from proxy.grpc.peer import can_tell_disconnects
from proxy.grpc.relay import GrpcRelay
from proxy.labels import CallProtocol
from proxy.metrics import ProxyMetrics

needs_sock_diag = pytest.mark.skipif(
    not can_tell_disconnects(), reason="needs Linux sock_diag to tell a disconnect from a cancel"
)
WAIT = 10.0  # upper bound on waiting for an event; tests finish as soon as it happens


@dataclass
class ScriptedUpstream:
    """A real gRPC server with raw-bytes methods; records events as (kind, request_id, detail)."""

    events: list[tuple[str, str, Any]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    port: int = 0
    _server: Any = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        raw = {
            "Echo": grpc.stream_stream_rpc_method_handler(self._echo),
            "Fail": grpc.unary_unary_rpc_method_handler(self._fail),
            "Hang": grpc.unary_stream_rpc_method_handler(self._hang),
        }
        cancel = grpc.unary_unary_rpc_method_handler(
            self._cancel,
            request_deserializer=cancellation_pb2.CancelRequest.FromString,
            response_serializer=cancellation_pb2.CancelResponse.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler("test.Scripted", raw),
                grpc.method_handlers_generic_handler("hangup.v1.Cancellation", {"Cancel": cancel}),
            ]
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0)

    async def record(self, kind: str, request_id: str, detail: Any = None) -> None:
        async with self.changed:
            self.events.append((kind, request_id, detail))
            self.changed.notify_all()

    async def wait_for(self, kind: str) -> tuple[str, str, Any]:
        async with asyncio.timeout(WAIT), self.changed:
            await self.changed.wait_for(lambda: any(e[0] == kind for e in self.events))
        return next(e for e in self.events if e[0] == kind)

    @staticmethod
    def _id(context: Any) -> str:
        return dict(context.invocation_metadata()).get("x-request-id", "")

    async def _echo(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        metadata = dict(context.invocation_metadata())
        await self.record("metadata", self._id(context), (metadata, context.time_remaining()))
        await context.send_initial_metadata((("x-upstream", "scripted"),))
        async for message in requests:
            yield message.upper()
        context.set_trailing_metadata((("x-trailer", "done"),))

    async def _fail(self, request: bytes, context: Any) -> bytes:
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            "no such thing",
            trailing_metadata=(("x-why", "because"), ("x-blob-bin", b"\x00\xff")),
        )
        raise AssertionError("abort returns by raising")

    async def _hang(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        request_id = self._id(context)
        await self.record("hang", request_id, context.time_remaining())
        yield b"started"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.record("stream_closed", request_id)
            raise

    async def _cancel(self, request: Any, context: Any) -> Any:
        await self.record("cancel", request.request_id, request.reason)
        return cancellation_pb2.CancelResponse(
            request_id=request.request_id, state="cancelled", phase="decode", generated_tokens=1
        )


@dataclass
class Stack:
    upstream: ScriptedUpstream
    relay: GrpcRelay
    state: ServerState
    registry: CollectorRegistry
    channel: Any

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def method(self, name: str, kind: str = "stream_stream") -> Any:
        return getattr(self.channel, kind)(f"/test.Scripted/{name}")


async def _stack(upstream: ScriptedUpstream, **options: Any) -> tuple[GrpcRelay, ServerState]:
    config = Config(grpc_port=0, upstream_grpc=f"127.0.0.1:{upstream.port}", **options)
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry)
    adapter = GrpcCancelAdapter(config.upstream_grpc, None, config.cancel_attempt_timeout)
    canceller = Canceller(
        {CallProtocol.GRPC: adapter}, metrics, deadline=5.0, backoff=0.05, backoff_max=0.5,
        concurrency=8,
    )  # fmt: skip
    state = ServerState(config, metrics, canceller)
    relay = GrpcRelay(state)
    await relay.start()
    return relay, state


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[Stack]:
    upstream = ScriptedUpstream()
    await upstream.start()
    relay, state = await _stack(upstream, **options)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.port}")
    try:
        yield Stack(upstream, relay, state, state.metrics.registry, channel)
    finally:
        await channel.close()
        await relay.close()
        await state.canceller.drain(1.0)
        await state.canceller.close()
        await upstream.stop()


async def test_messages_metadata_trailers_and_request_id_are_relayed() -> None:
    async with running() as stack:
        call = stack.method("Echo")(metadata=(("x-tenant", "a"), ("x-key-bin", b"\x01\x02")))
        # Ping-pong: each answer arrives before the next request is sent (nothing is buffered).
        for word in (b"one", b"two", b"three"):
            await call.write(word)
            assert await call.read() == word.upper()
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        initial = dict(await call.initial_metadata())
        assert dict(await call.trailing_metadata())["x-trailer"] == "done"

        _, request_id, (seen, deadline) = await stack.upstream.wait_for("metadata")
        assert seen["x-tenant"] == "a" and seen["x-key-bin"] == b"\x01\x02"
        assert len(request_id) == 32 and int(request_id, 16) >= 0
        assert initial["x-upstream"] == "scripted" and initial["x-request-id"] == request_id
        assert deadline is None  # the client set none, so the relay passed none
        assert stack.sample("hangup_proxy_requests_total", protocol="grpc", outcome="completed")


async def test_the_client_address_is_appended_to_x_forwarded_for() -> None:
    """As on HTTP: the last element of x-forwarded-for is the address the proxy saw, whatever
    the client wrote there (the gateway's fair shares read it: --client-header)."""
    async with running() as stack:
        echo = stack.method("Echo", "unary_unary")
        await echo(b"x")
        await echo(b"x", metadata=(("x-forwarded-for", "10.9.9.9, 127.0.0.1"),))
        seen = [e[2][0].get("x-forwarded-for") for e in stack.upstream.events]
        assert seen == ["127.0.0.1", "10.9.9.9, 127.0.0.1, 127.0.0.1"]


async def test_each_call_gets_its_own_request_id_and_a_client_id_is_not_trusted() -> None:
    async with running() as stack:
        for _ in range(2):
            await stack.method("Echo", "unary_unary")(b"x", metadata=(("x-request-id", "mine"),))
        ids = [e[1] for e in stack.upstream.events if e[0] == "metadata"]
        assert len(set(ids)) == 2 and "mine" not in ids
        clients = [e[2][0].get("x-client-request-id") for e in stack.upstream.events]
        assert clients == ["mine", "mine"]


async def test_upstream_status_details_and_trailers_reach_the_client() -> None:
    async with running() as stack:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stack.method("Fail", "unary_unary")(b"x")
        assert failure.value.code() == grpc.StatusCode.NOT_FOUND
        assert failure.value.details() == "no such thing"
        trailers = dict(failure.value.trailing_metadata())
        assert trailers["x-why"] == "because" and trailers["x-blob-bin"] == b"\x00\xff"


async def test_client_cancel_sends_an_explicit_cancel_before_closing_the_upstream() -> None:
    async with running() as stack:
        call = stack.method("Hang", "unary_stream")(b"go")
        assert await call.read() == b"started"
        call.cancel()
        _, request_id, reason = await stack.upstream.wait_for("cancel")
        await stack.upstream.wait_for("stream_closed")
        assert reason == Reason.GRPC_CANCELLED.value
        kinds = [e[0] for e in stack.upstream.events if e[1] == request_id]
        assert kinds == ["hang", "cancel", "stream_closed"]
        assert stack.sample(
            "hangup_proxy_client_disconnects_total", protocol="grpc", stage="streaming"
        )
        await _until(lambda: stack.state.inflight == 0)
        assert stack.sample("hangup_proxy_cancel_calls_total", adapter="hangup_grpc", result="ok")


async def test_deadline_is_passed_upstream_and_its_expiry_cancels_with_that_reason() -> None:
    async with running() as stack:
        call = stack.method("Hang", "unary_stream")(b"go", timeout=1.0)
        assert await call.read() == b"started"
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        _, _, remaining = await stack.upstream.wait_for("hang")
        assert 0.5 < remaining < 1.1  # the client's deadline, less the time spent getting here
        _, _, reason = await stack.upstream.wait_for("cancel")
        assert reason == Reason.DEADLINE_EXCEEDED.value


@needs_sock_diag
async def test_a_client_that_vanishes_is_cancelled_as_a_disconnect() -> None:
    async with running() as stack:
        script = textwrap.dedent(
            f"""
            import asyncio, grpc, signal
            async def main():
                channel = grpc.aio.insecure_channel("127.0.0.1:{stack.relay.port}")
                call = channel.unary_stream("/test.Scripted/Hang")(b"go")
                print((await call.read()).decode(), flush=True)
                await asyncio.Event().wait()
            asyncio.run(main())
            """
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, env=child_env()
        )
        assert child.stdout is not None
        try:
            async with asyncio.timeout(WAIT):
                assert (await child.stdout.readline()).strip() == b"started"
        finally:
            child.kill()
            await child.wait()
        _, _, reason = await stack.upstream.wait_for("cancel")
        assert reason == Reason.CLIENT_DISCONNECT.value


async def test_unreachable_upstream_is_unavailable_and_counted() -> None:
    async with running() as stack:
        await stack.upstream.stop()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stack.method("Echo", "unary_unary")(b"x", timeout=WAIT)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        await _until(lambda: stack.state.inflight == 0)
        assert stack.sample(
            "hangup_proxy_requests_total", protocol="grpc", outcome="upstream_error"
        )


async def test_concurrency_limit_and_draining_refuse_new_calls() -> None:
    async with running(max_concurrent_streams=1) as stack:
        hanging = stack.method("Hang", "unary_stream")(b"go")
        assert await hanging.read() == b"started"
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await stack.method("Echo", "unary_unary")(b"x")
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        stack.state.draining = True
        assert stack.state.stop_all(Reason.SHUTDOWN) == 1
        with pytest.raises(grpc.aio.AioRpcError) as stopped:
            await hanging.read()
        assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
        _, _, reason = await stack.upstream.wait_for("cancel")
        assert reason == Reason.SHUTDOWN.value
        with pytest.raises(grpc.aio.AioRpcError) as draining:
            await stack.method("Echo", "unary_unary")(b"x")
        assert draining.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_max_request_duration_ends_the_call_as_a_proxy_timeout() -> None:
    async with running(max_request_duration=0.5) as stack:
        call = stack.method("Hang", "unary_stream")(b"go")
        assert await call.read() == b"started"
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert failure.value.details() == "proxy timeout"
        _, _, reason = await stack.upstream.wait_for("cancel")
        assert reason == Reason.PROXY_TIMEOUT.value


async def _until(predicate: Any) -> None:
    """Poll ``predicate`` on every loop turn until true (bounded by WAIT)."""
    await wait_until(predicate, WAIT)


async def test_a_request_message_over_the_body_limit_is_refused() -> None:
    async with running(max_body_size=10) as stack:
        assert await stack.method("Echo", "unary_unary")(b"x" * 10) == b"X" * 10
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.method("Echo", "unary_unary")(b"x" * 11)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_trusted_client_id_is_used_upstream_and_a_malformed_one_refused() -> None:
    async with running(trust_client_request_id=True) as stack:
        call = stack.method("Echo", "unary_unary")(b"x", metadata=(("x-request-id", "mine-1"),))
        await call
        assert dict(await call.initial_metadata())["x-request-id"] == "mine-1"
        _, request_id, _ = await stack.upstream.wait_for("metadata")
        assert request_id == "mine-1"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.method("Echo", "unary_unary")(b"x", metadata=(("x-request-id", "a b"),))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert stack.sample("hangup_proxy_requests_total", protocol="grpc", outcome="rejected")
