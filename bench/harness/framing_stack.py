"""Everything the framing battery runs against, started at once on 127.0.0.1:0.

``running_targets(work)`` yields the request targets (hangup's proxy and Envoy, each in front of a
recording upstream of its own; the naive relay in ``NAIVE_LANES`` lanes, each a relay and an
upstream of its own, so that its many stuck cases wait side by side, and the naive relay that
reuses its upstream connection, on ``REUSING_CASES``; the gateway with the simulated engine; the
proxy's admin listener) and the response targets (the proxy, Envoy and the naive relay that
reuses its upstream connection, each in front of ``ScriptedAnswers``). The proxy runs as users
run it, ``hangup-proxy --cancel-adapter none``; Envoy relays request trailers and accepts
HTTP/1.0 (``running_envoy(trailers=True)``), the front door that lets through the most a client
can send. ``run_battery(work)`` runs every case against every target at once (each target, or
lane, takes its cases one at a time) and returns what was seen. The naive relays are there to
be caught: the battery's rules are shown to fire on them
(``tests/multi_process/test_framing_battery.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.base.processes import spawn
from bench.harness.envoy import running_envoy
from bench.harness.framing_battery import (
    Result,
    ScriptedAnswers,
    Target,
    run_requests,
    run_requests_in_lanes,
    run_responses,
)
from bench.harness.framing_cases import REQUESTS
from bench.harness.naive_relay import NaiveRelay
from bench.harness.recording_upstream import RecordingUpstream

_PORTS = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0"]
NAIVE_LANES = 8
# The naive relay never ends what its client left: a half-sent request stays so for good, and
# waiting the proxy's SETTLE_S to see that would only make each of its stuck cases slower.
NAIVE_SETTLE_S = 1.0
# A relay that hands its upstream connection to the next client: after a request it left
# half-sent, the next call (the probe) lands in that request. Only a few cases: on the others one
# case's leftovers would land in the next case's results.
REUSING_CASES = ("cl-te", "te-cl", "chunk-last-missing")


@dataclass
class Targets:
    requests: dict[str, Target]  # hangup, envoy, gateway, admin
    naive: list[Target]  # the naive relay's lanes
    reusing: Target  # the naive relay that reuses its upstream connection
    responses: dict[str, Target]  # hangup, envoy, naive (reusing its upstream connection)


def _proxy_args(upstream: str) -> list[str]:
    return [*_PORTS, "--cancel-adapter", "none", "--upstream-http", upstream]


@contextlib.asynccontextmanager
async def running_targets(work: Path) -> AsyncIterator[Targets]:
    async with contextlib.AsyncExitStack() as stack:
        ups = [await stack.enter_async_context(RecordingUpstream()) for _ in range(2)]
        answers = [await stack.enter_async_context(ScriptedAnswers()) for _ in range(3)]
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
        lanes = []
        for _ in range(NAIVE_LANES):
            upstream = await stack.enter_async_context(RecordingUpstream())
            relay = await stack.enter_async_context(NaiveRelay(upstream.port))
            lanes.append(Target("naive", relay.address, upstream, settle_s=NAIVE_SETTLE_S))
        reusing_up = await stack.enter_async_context(RecordingUpstream())
        reusing = await stack.enter_async_context(NaiveRelay(reusing_up.port, reuse=True))
        reusing_answers = await stack.enter_async_context(NaiveRelay(answers[2].port, reuse=True))
        yield Targets(
            {
                "hangup": Target("hangup", proxy.listeners["http"], ups[0]),
                "envoy": Target("envoy", envoy.address, ups[1]),
                "gateway": Target(
                    "gateway", gateway.listeners["http"], probe=_probe("/v2/health/live")
                ),
                "admin": Target("admin", proxy.listeners["admin"], probe=_probe("/healthz")),
            },
            lanes,
            Target("naive-reusing", reusing.address, reusing_up, settle_s=NAIVE_SETTLE_S),
            {
                "hangup": Target("hangup", responding.listeners["http"]),
                "envoy": Target("envoy", envoy_responding.address),
                "naive": Target("naive", reusing_answers.address),
            },
        )


def _probe(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: up\r\n\r\n".encode()


@dataclass
class Seen:
    requests: dict[str, list[Result]]  # per target, a result per case of REQUESTS
    responses: dict[str, list[Result]]  # per relay, a result per case of RESPONSES


async def run_battery(work: Path) -> Seen:
    """Every case against every target; ``requests["naive"]`` is the naive relay's lanes',
    ``requests["naive-reusing"]`` has ``REUSING_CASES`` only."""
    async with running_targets(work) as targets:
        names = [*targets.requests, "naive", "naive-reusing"]
        reused = [c for c in REQUESTS if c.name in REUSING_CASES]
        runs = [*(run_requests(t) for t in targets.requests.values()),
                run_requests_in_lanes(targets.naive),
                run_requests(targets.reusing, reused)]  # fmt: skip
        requests = await asyncio.gather(*runs)
        responses = await asyncio.gather(*(run_responses(t) for t in targets.responses.values()))
    return Seen(dict(zip(names, requests, strict=True)),
                dict(zip(targets.responses, responses, strict=True)))  # fmt: skip
