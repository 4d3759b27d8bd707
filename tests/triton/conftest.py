"""The Triton tier's fixtures: one real Triton (``bench/harness/triton/server.py``) serving the
project's python-backend models, and hangup's proxy in front of it, shared by the session. The
tier skips, saying why, where ``make test`` could not install Triton."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.base.processes import Process, spawn
from bench.harness.triton.server import TritonServer, install, running_triton
from bench.harness.unavailable import Unavailable


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    found = install()
    if isinstance(found, str):
        raise Unavailable(found)
    with running_triton(tmp_path_factory.mktemp("triton"), found) as server:
        yield server


@pytest.fixture(scope="session")
def triton_proxy(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    """``hangup-proxy`` in front of Triton, HTTP and gRPC. Over gRPC, closing the upstream call
    is Triton's cancellation, so no cancel adapter is needed (``none``)."""
    args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", triton.url(), "--upstream-grpc", triton.grpc,
            "--cancel-adapter", "none"]  # fmt: skip
    with spawn("proxy", args, tmp_path_factory.mktemp("triton-proxy")) as proc:
        yield proc
        proc.terminate()


BRIDGE_TOKEN = "bridge-token"


def bridge_args(server: TritonServer) -> list[str]:
    """``hangup-proxy --cancel-adapter triton`` in front of ``server``, on ephemeral ports."""
    return ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
            "--upstream-http", server.url(), "--upstream-grpc", server.grpc,
            "--cancel-adapter", "triton"]  # fmt: skip


@pytest.fixture(scope="session")
def triton_bridge(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    """``hangup-proxy --cancel-adapter triton`` in front of Triton: HTTP generate and
    generate_stream carried over gRPC, so that a hang-up cancels the call."""
    tmp = tmp_path_factory.mktemp("triton-bridge")
    token = tmp / "cancel-token"
    token.write_text(BRIDGE_TOKEN)
    args = [*bridge_args(triton), "--cancel-token-file", str(token)]  # its cancel by id on
    with spawn("proxy", args, tmp) as proc:
        yield proc
        proc.terminate()


@pytest.fixture(scope="session")
def sim_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The gateway on its simulated engine, serving a model named as Triton's streamer, for the
    parity tests (HTTP and gRPC)."""
    args = ["--engine", "sim", "--model", "streamer", "--http-port", "0", "--grpc-port", "0"]
    with spawn("gateway_server", args, tmp_path_factory.mktemp("triton-parity")) as proc:
        yield proc
        proc.terminate()
