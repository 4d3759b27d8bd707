"""Everything the framing battery runs against, started at once on 127.0.0.1:0.

``running_targets(work)`` yields the request targets (hangup's proxy, Envoy and the naive
relay, each in front of a recording upstream of its own; the gateway with the simulated engine;
the proxy's admin listener) and the response targets (the proxy and Envoy in front of
``ScriptedAnswers``). The proxy runs as users run it, ``hangup-proxy --cancel-adapter none``;
Envoy relays request trailers and accepts HTTP/1.0 (``running_envoy(trailers=True)``), the
front door that lets through the most a client can send. ``run_battery(work)`` runs every case
against every target at once (each target takes its cases one at a time) and returns what was
seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.harness.envoy import running_envoy
from bench.harness.framing_battery import (
    Result,
    ScriptedAnswers,
    Target,
    run_requests,
    run_responses,
)
from bench.harness.framing_cases import REQUESTS
from bench.harness.naive_relay import NaiveRelay
from bench.harness.processes import spawn
from bench.harness.recording_upstream import RecordingUpstream

_PORTS = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0"]


@dataclass
class Targets:
    requests: dict[str, Target]  # hangup, envoy, naive, gateway, admin
    responses: dict[str, Target]  # hangup, envoy


def _proxy_args(upstream: str) -> list[str]:
    return [*_PORTS, "--cancel-adapter", "none", "--upstream-http", upstream]


@contextlib.asynccontextmanager
async def running_targets(work: Path) -> AsyncIterator[Targets]:
    async with contextlib.AsyncExitStack() as stack:
        ups = [await stack.enter_async_context(RecordingUpstream()) for _ in range(3)]
        answers = [await stack.enter_async_context(ScriptedAnswers()) for _ in range(2)]
        proxy = stack.enter_context(spawn("proxy", _proxy_args(ups[0].url), work / "proxy"))
        responding = stack.enter_context(
            spawn("proxy", _proxy_args(answers[0].url), work / "proxy-responses")
        )
        envoy = stack.enter_context(running_envoy(ups[1].port, work / "envoy", trailers=True))
        envoy_responding = stack.enter_context(
            running_envoy(answers[1].port, work / "envoy-responses", trailers=True)
        )
        gateway_args = ["--engine", "sim", "--http-port", "0", "--grpc-port", "0"]
        gateway = stack.enter_context(spawn("gateway_server", gateway_args, work / "gateway"))
        naive = await stack.enter_async_context(NaiveRelay(ups[2].port))
        yield Targets(
            {
                "hangup": Target("hangup", proxy.listeners["http"], ups[0]),
                "envoy": Target("envoy", envoy.address, ups[1]),
                "naive": Target("naive", naive.address, ups[2]),
                "gateway": Target(
                    "gateway", gateway.listeners["http"], probe=_probe("/v2/health/live")
                ),
                "admin": Target("admin", proxy.listeners["admin"], probe=_probe("/healthz")),
            },
            {
                "hangup": Target("hangup", responding.listeners["http"]),
                "envoy": Target("envoy", envoy_responding.address),
            },
        )


def _probe(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: up\r\n\r\n".encode()


@dataclass
class Seen:
    requests: dict[str, list[Result]]  # per target, a result per case of REQUESTS
    responses: dict[str, list[Result]]  # per relay, a result per case of RESPONSES


async def run_battery(work: Path) -> Seen:
    """The naive relay gets the two CL/TE conflicts only: it is there to be caught on them."""
    async with running_targets(work) as targets:
        cl_te = [c for c in REQUESTS if c.name in ("cl-te", "te-cl")]
        runs = [run_requests(t, cl_te if n == "naive" else REQUESTS)
                for n, t in targets.requests.items()]  # fmt: skip
        requests = await asyncio.gather(*runs)
        responses = await asyncio.gather(*(run_responses(t) for t in targets.responses.values()))
    return Seen(dict(zip(targets.requests, requests, strict=True)),
                dict(zip(targets.responses, responses, strict=True)))  # fmt: skip
