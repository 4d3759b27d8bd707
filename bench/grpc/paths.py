"""The three ways a gRPC client reaches the gateway in the gRPC benchmarks, and a small client.

- ``direct``: client → gateway;
- ``hangup``: client → hangup's proxy (``python -m proxy``) → gateway;
- ``envoy``: client → Envoy (HTTP/2 router, one worker thread) → gateway. Envoy resets the
  upstream stream when the client resets its own, and makes no cancel call.

Every path gets a fresh gateway (``bench.instruments.probe_gateway``: it logs when each abort was
asked of the engine and when a step boundary applied it) so runs do not disturb each other. Envoy
binds port 0; its bound port is read from its admin API, polled until it answers (no sleeps on a
guess).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.base.addresses import port_of
from bench.base.processes import spawn
from bench.base.scrape import scrape
from bench.harness.envoy import envoy_binary
from hangup_contract.protos import inference_pb2 as pb

PATHS = ("direct", "hangup", "envoy")
MODEL = "hangup-sim"

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
_HTTP = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def envoy_config(upstream_port: int) -> dict[str, Any]:
    """Envoy as a plain HTTP/2 router in front of the gateway (no retries, no timeouts)."""
    manager = {
        "@type": _HCM + "HttpConnectionManager",
        "stat_prefix": "grpc",
        "codec_type": "AUTO",
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"},
                        "route": {"cluster": "gateway", "timeout": "0s"}}],
        }]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }  # fmt: skip
    cluster = {
        "name": "gateway",
        "type": "STATIC",
        "typed_extension_protocol_options": {_HTTP.rsplit("/", 1)[1]: {
            "@type": _HTTP, "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "gateway", "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _address(upstream_port)}}]}]},
    }  # fmt: skip
    listener = {
        "name": "grpc",
        "address": _address(0),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}],
    }  # fmt: skip
    return {
        "admin": {"address": _address(0)},
        "static_resources": {"listeners": [listener], "clusters": [cluster]},
    }


@dataclass
class Path_:
    name: str
    target: str  # host:port the client dials
    gateway_http: str  # the gateway's HTTP base URL (metrics, cancel API)
    gateway_pid: int
    relay_pid: int | None  # the proxy's or Envoy's pid (None: direct)
    boundary_log: Path


@contextlib.contextmanager
def envoy(work: Path, upstream: str, timeout: float = 30.0) -> Iterator[tuple[str, int]]:
    """Run Envoy in front of ``upstream``; yields its gRPC ``host:port`` and pid."""
    config = work / "envoy.json"
    config.write_text(json.dumps(envoy_config(port_of(upstream))))
    admin_file = work / "envoy.admin"
    admin_file.unlink(missing_ok=True)
    log = (work / "envoy.log").open("wb")
    process = subprocess.Popen(
        [str(envoy_binary()), "-c", str(config), "--concurrency", "1", "--log-level", "error",
         "--admin-address-path", str(admin_file), "--disable-hot-restart"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"127.0.0.1:{_envoy_port(process, admin_file, timeout)}", process.pid
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def _envoy_port(process: subprocess.Popen[bytes], admin_file: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"envoy exited with {process.returncode}")
        admin = admin_file.read_text().strip() if admin_file.exists() else ""
        if admin:
            with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
                url = f"http://{admin}/listeners?format=json"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    listeners = json.load(resp)["listener_statuses"]
                address = listeners[0]["local_address"]["socket_address"]
                return int(address["port_value"])
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(0.02)  # between looks: wakes at once if Envoy exits
    raise TimeoutError("envoy did not report its listener")


@contextlib.contextmanager
def path(name: str, work: Path, gateway_args: list[str]) -> Iterator[Path_]:
    """A fresh gateway and, for ``hangup`` and ``envoy``, the relay in front of it."""
    work.mkdir(parents=True, exist_ok=True)
    boundary_log = work / f"probe-{name}.jsonl"
    args = ["--http-port", "0", "--grpc-port", "0", "--log-level", "ERROR", *gateway_args,
            "--probe-log", str(boundary_log)]  # fmt: skip
    with spawn("bench.instruments.probe_gateway", args, work / f"gw-{name}") as gw:
        try:
            if name == "direct":
                yield Path_(name, gw.listeners["grpc"], gw.url(), gw.popen.pid, None, boundary_log)
            elif name == "hangup":
                proxy_args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                              "--upstream-http", gw.url(), "--upstream-grpc",
                              gw.listeners["grpc"], "--log-level", "ERROR"]  # fmt: skip
                with spawn("proxy", proxy_args, work / "proxy") as px:
                    yield Path_(name, px.listeners["grpc"], gw.url(), gw.popen.pid,
                                px.popen.pid, boundary_log)  # fmt: skip
                    px.terminate()
            else:
                with envoy(work, gw.listeners["grpc"]) as (target, pid):
                    yield Path_(name, target, gw.url(), gw.popen.pid, pid, boundary_log)
        finally:
            gw.terminate()  # writes the boundary log


@dataclass(frozen=True)
class Abort:
    requested: float  # the gateway asked the engine to abort
    boundary: float  # a step boundary applied it
    confirmed: float | None  # the gateway held the engine's confirmation


def aborts(log: Path) -> dict[str, Abort]:
    """Engine request id → when its abort was asked for, applied and confirmed."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return {r["id"]: Abort(r["requested"], r["boundary"], r["confirmed"]) for r in records}


def text_request(request_id: str, prompt: str, max_tokens: int, stream: bool) -> Any:
    """A ModelInferRequest in the vLLM backend's shape (data in the typed contents)."""
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(prompt.encode())
    flag = request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(stream)
    params = request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    sampling = {"max_tokens": max_tokens, "ignore_eos": True}
    params.contents.bytes_contents.append(json.dumps(sampling).encode())
    return request


def stubs(channel: grpc.aio.Channel) -> tuple[Any, Any]:
    """(ModelInfer, ModelStreamInfer) callables on ``channel``."""
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    stream = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    return infer, stream


def gateway_cancellations(base_url: str) -> dict[str, float]:
    """``hangup_gateway_cancellations_total`` by reason, read from the gateway's ``/metrics``."""
    totals: dict[str, float] = {}
    for (name, labels), value in scrape(base_url).items():
        if name == "hangup_gateway_cancellations_total" and value:
            reason = dict(labels)["reason"]
            totals[reason] = totals.get(reason, 0.0) + value
    return totals
