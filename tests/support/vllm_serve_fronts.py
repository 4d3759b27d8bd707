"""vLLM's own server (``vllm serve``, tiny local model, ``--enable-log-requests``, dev mode so
``POST /abort_requests`` exists) with ``hangup-proxy --cancel-adapter vllm`` in front of it in
each mode: ``close`` (a hang-up closes the upstream stream; vLLM aborts on disconnect) and
``abort`` (``--vllm-abort-endpoint``: the proxy also calls vLLM's abort endpoint). What the
tests of the ``vllm`` adapter read from outside: vLLM's metrics and its log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.base.processes import Process, spawn
from bench.base.scrape import Samples, scrape, total
from bench.harness.vllm_stack import ENGINE_ARGS, vllm_serve

MODES = ("close", "abort")
TOKEN = "sidecar-token"  # the proxies' own cancel by id is on, behind it


@dataclass
class Served:
    url: str
    log: Path
    fronts: dict[str, Process]
    """The proxy in front of vLLM, by mode."""

    def samples(self) -> Samples:
        return scrape(self.url)

    def idle(self) -> Samples | None:
        """vLLM's samples once nothing runs or waits and its KV cache is empty, else None."""
        s = self.samples()
        busy = total(s, "vllm:num_requests_running") + total(s, "vllm:num_requests_waiting")
        return None if busy or total(s, "vllm:kv_cache_usage_perc") else s

    def logged(self, text: str) -> bool:
        """``text`` is in vLLM's log."""
        return text in self.log.read_text(errors="replace")


S = TypeVar("S", bound=Served)


@contextlib.contextmanager
def served_with_fronts(
    kind: type[S], model: Path, tmp: Path, env: dict[str, str] | None = None
) -> Iterator[S]:
    """``vllm serve`` on ``model`` (``env`` added to its environment) and a proxy per mode."""
    args = [*ENGINE_ARGS, "--enable-log-requests"]
    token = tmp / "cancel-token"
    token.write_text(TOKEN)
    with vllm_serve(model, tmp, args, dev_mode=True, env=env) as url:
        common = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0",
                  "--upstream-http", url, "--cancel-adapter", "vllm",
                  "--trust-client-request-id", "--cancel-token-file", str(token)]  # fmt: skip
        with (
            spawn("proxy", common, tmp / "close") as close,
            spawn("proxy", [*common, "--vllm-abort-endpoint"], tmp / "abort") as abort,
        ):
            yield kind(url, tmp / "vllm-serve.log", {"close": close, "abort": abort})
