"""The Truss tier: truss 0.18.36's own model server (no Docker) serving the project's own Truss
models, straight and behind ``hangup-proxy --cancel-adapter none``; skipped, with the reason,
where ``.venv-truss`` is missing (``make test`` installs it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.base.processes import Process, spawn
from bench.harness.truss import server as truss_server
from bench.harness.truss.server import TrussServer
from bench.harness.unavailable import Unavailable

MODELS = ["polling", "polling_stream", "watcher_sync", "ignoring_stream"]
TOKEN = "truss-sidecar-token"


@dataclass
class Pod:
    """A Truss server and its sidecars: ``none`` (the adapter for Truss: no cancel call, the
    upstream connection closed) and, for ``polling``, ``hangup`` (the default: what it does in
    front of a server with no cancel API)."""

    server: TrussServer
    sidecars: dict[str, Process]


@pytest.fixture(scope="session")
def truss_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pod]]:
    if reason := truss_server.skip_reason():
        raise Unavailable(reason)
    work = tmp_path_factory.mktemp("truss")
    token = work / "cancel-token"
    token.write_text(TOKEN)
    with truss_server.running_truss(MODELS, work) as servers, contextlib.ExitStack() as stack:
        pods = {}
        for model, server in servers.items():
            sidecars = {}
            for adapter in ("none", "hangup") if model == "polling" else ("none",):
                args = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                        "--upstream-http", server.url(), "--cancel-adapter", adapter,
                        "--trust-client-request-id", "--cancel-token-file", str(token)]  # fmt: skip
                sidecars[adapter] = stack.enter_context(
                    spawn("proxy", args, work / f"{model}-{adapter}")
                )
            pods[model] = Pod(server, sidecars)
        yield pods
