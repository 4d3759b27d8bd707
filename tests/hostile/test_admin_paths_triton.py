"""Triton's admin API through the sidecar (``--cancel-adapter triton``), against a real Triton 2.51
in explicit model-control mode (``bench/harness/triton/server.py``): a client that reaches the pod
reaches the sidecar, and without the refusal it could unload every model, point trace output at a
file, raise the log level, or register shared memory of the server's host.

Each case shows first that the route really is Triton's admin API (straight to Triton it works:
a model unloaded and loaded again, settings answered), then that the sidecar refuses it (403 in
Triton's error shape, naming the rule; gRPC ``PERMISSION_DENIED``) and that nothing changed; an
operator's ``--allow-admin-path`` opens a route; health, metadata, statistics and inference pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as service

from bench.base.processes import Process, spawn
from bench.base.scrape import metric_sum
from bench.harness.triton.server import TritonServer, install, running_triton
from bench.harness.unavailable import Unavailable
from tests.support.exact_target import send

pytestmark = pytest.mark.slow

MODEL = "sequence_sum"  # unloaded and loaded again by the cases that prove the API works
OPENED = ["/v2/repository/index", "/inference.GRPCInferenceService/RepositoryIndex"]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    found = install()
    if isinstance(found, str):
        raise Unavailable(found)
    control = ["--model-control-mode", "explicit", "--load-model", "*"]
    with running_triton(tmp_path_factory.mktemp("triton-admin"), found, args=control) as server:
        yield server


def _sidecar(triton: TritonServer, tmp: Path, *extra: str) -> Iterator[Process]:
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", triton.url(), "--upstream-grpc", triton.grpc,
            "--cancel-adapter", "triton", *extra]  # fmt: skip
    with spawn("proxy", args, tmp) as proc:
        yield proc
        proc.terminate()


@pytest.fixture(scope="module")
def sidecar(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    yield from _sidecar(triton, tmp_path_factory.mktemp("sidecar"))


@pytest.fixture(scope="module")
def opened(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    flags = [arg for path in OPENED for arg in ("--allow-admin-path", path)]
    yield from _sidecar(triton, tmp_path_factory.mktemp("opened"), *flags)


def ready(triton: TritonServer, model: str = MODEL) -> bool:
    return send(triton.url(), "GET", f"/v2/models/{model}/ready")[0] == 200


def refused_as_triton(answer: tuple[int, bytes], rule: str) -> None:
    status, body = answer
    assert status == 403, (status, body[:300])
    error = json.loads(body)["error"]
    assert isinstance(error, str) and f"rule {rule}" in error, error


UNLOAD = f"/v2/repository/models/{MODEL}/unload"
SPELLINGS = [
    UNLOAD, "/" + UNLOAD, UNLOAD + "/", UNLOAD + "?x=1", UNLOAD.upper(), UNLOAD + ";x",
    UNLOAD.replace("/repository", "/%72epository"), UNLOAD.replace(MODEL, MODEL[:3] + "%5f" +
    MODEL[4:]), UNLOAD.replace("/models", "/x/../models"),
]  # fmt: skip


def test_a_model_unloaded_straight_stays_loaded_through_the_sidecar(
    triton: TritonServer, sidecar: Process
) -> None:
    assert ready(triton)
    assert send(triton.url(), "POST", UNLOAD, {})[0] == 200  # the admin API, straight
    assert not ready(triton)
    assert send(triton.url(), "POST", f"/v2/repository/models/{MODEL}/load", {})[0] == 200
    assert ready(triton)
    for target in SPELLINGS:
        refused_as_triton(send(sidecar.url(), "POST", target, {}), "triton-model-repository")
        assert ready(triton), f"{target} unloaded the model through the sidecar"
    load = f"/v2/repository/models/{MODEL}/load"
    refused_as_triton(send(sidecar.url(), "POST", load, {}), "triton-model-repository")


# (method, target, body, rule): each answers straight (not Triton's 404 for no route)
SETTINGS = [
    ("POST", "/v2/repository/index", {}, "triton-model-repository"),
    ("GET", "/v2/trace/setting", None, "triton-trace"),
    ("POST", "/v2/trace/setting", {"trace_level": ["OFF"]}, "triton-trace"),
    ("GET", f"/v2/models/{MODEL}/trace/setting", None, "triton-trace"),
    ("GET", "/v2/logging", None, "triton-logging"),
    ("POST", "/v2/logging", {"log_verbose_level": 0}, "triton-logging"),
    ("GET", "/v2/systemsharedmemory/status", None, "triton-shared-memory"),
    ("POST", "/v2/systemsharedmemory/region/r/register", {}, "triton-shared-memory"),
    ("POST", "/v2/systemsharedmemory/unregister", {}, "triton-shared-memory"),
    ("GET", "/v2/cudasharedmemory/status", None, "triton-shared-memory"),
    ("POST", "/v2/cudasharedmemory/region/r/register", {}, "triton-shared-memory"),
]


@pytest.mark.parametrize(("method", "target", "body", "rule"), SETTINGS)
def test_each_admin_route_answers_straight_and_is_refused_through_the_sidecar(
    triton: TritonServer, sidecar: Process, method: str, target: str, body: object, rule: str
) -> None:
    status, answer = send(triton.url(), method, target, body)
    assert status != 404, f"Triton has no {target}: {answer[:200]!r}"
    refused_as_triton(send(sidecar.url(), method, target, body), rule)


GRPC_ADMIN = [
    ("RepositoryIndex", pb.RepositoryIndexRequest(), "triton-model-repository"),
    ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=MODEL),
     "triton-model-repository"),
    ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=MODEL),
     "triton-model-repository"),
    ("TraceSetting", pb.TraceSettingRequest(), "triton-trace"),
    ("LogSettings", pb.LogSettingsRequest(), "triton-logging"),
    ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(), "triton-shared-memory"),
    ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(),
     "triton-shared-memory"),
    ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(), "triton-shared-memory"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "message", "rule"), GRPC_ADMIN)
def test_each_grpc_admin_method_answers_straight_and_is_refused_through_the_sidecar(
    triton: TritonServer, sidecar: Process, call: str, message: object, rule: str
) -> None:
    with grpc.insecure_channel(triton.grpc) as straight:
        getattr(service.GRPCInferenceServiceStub(straight), call)(message, timeout=30)
    if call == "RepositoryModelUnload":  # it did: loaded again before the sidecar is tried
        assert not ready(triton)
        assert send(triton.url(), "POST", f"/v2/repository/models/{MODEL}/load", {})[0] == 200
    assert ready(triton)
    with (
        grpc.insecure_channel(sidecar.listeners["grpc"]) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        getattr(service.GRPCInferenceServiceStub(channel), call)(message, timeout=30)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"rule {rule}" in (refused.value.details() or "")
    assert ready(triton)


def test_an_opened_route_is_relayed_and_only_it(triton: TritonServer, opened: Process) -> None:
    status, body = send(opened.url(), "POST", "/v2/repository/index", {})
    assert status == 200 and {"name": MODEL, "version": "1", "state": "READY"} in json.loads(body)
    refused_as_triton(send(opened.url(), "POST", UNLOAD, {}), "triton-model-repository")
    with grpc.insecure_channel(opened.listeners["grpc"]) as channel:
        stub = service.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        assert MODEL in [model.name for model in index.models]
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=MODEL))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert ready(triton)


def test_health_metadata_statistics_and_inference_pass(sidecar: Process) -> None:
    base = sidecar.url()
    for target in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{MODEL}",
                   f"/v2/models/{MODEL}/config", f"/v2/models/{MODEL}/stats"):  # fmt: skip
        status, body = send(base, "GET", target)
        assert status == 200, (target, body[:200])
    generate = {"text_input": "hi", "sampling_parameters": '{"max_tokens": 2}'}
    status, body = send(base, "POST", "/v2/models/streamer/generate", generate)
    assert status == 200, body[:300]
    with grpc.insecure_channel(sidecar.listeners["grpc"]) as channel:
        stub = service.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live
        assert stub.ModelReady(pb.ModelReadyRequest(name=MODEL), timeout=30).ready


def test_the_refusals_are_counted_by_rule_on_the_admin_port(sidecar: Process) -> None:
    refused_as_triton(send(sidecar.url(), "GET", "/v2/logging"), "triton-logging")
    admin = sidecar.url("admin")
    assert send(admin, "GET", "/healthz")[0] == 200
    count = metric_sum(admin, "hangup_proxy_admin_refusals_total", rule="triton-logging")
    assert count >= 1
