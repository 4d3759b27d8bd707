"""vLLM's ``AsyncLLM`` inside a real Triton (``bench/harness/triton/vllm_models/vllm_tiny``: the
tiny local model with the vLLM tier's engine options), for the Triton tier's real-engine tests and
``bench.triton.with_vllm``: starting it, and reading what its model records (how each request ended;
the engine core's latest scheduler statistics)."""

from __future__ import annotations

import contextlib
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.base.waiting import wait_until
from bench.harness.triton.server import TritonServer, install, running_triton
from bench.harness.unavailable import Unavailable
from bench.harness.vllm_stack import ENGINE_ARGS

MODEL = "vllm_tiny"
MODELS = Path(__file__).parent / "vllm_models"
START_S = 300.0


def engine_args(model: Path) -> dict[str, Any]:
    """The vLLM tier's engine options (``ENGINE_ARGS``) as ``AsyncEngineArgs`` fields."""
    args: dict[str, Any] = {"model": str(model), "served_model_name": [MODEL]}
    flags = iter(ENGINE_ARGS)
    for flag in flags:
        name = flag.removeprefix("--").replace("-", "_")
        if name.startswith("no_"):
            args[name.removeprefix("no_")] = False
        elif name == "enforce_eager":
            args[name] = True
        else:
            args[name] = int(next(flags))
    return args


@contextlib.contextmanager
def triton_with_vllm(tmp: Path, model: Path) -> Iterator[TritonServer]:
    """Triton serving vLLM on ``model``; raises ``Unavailable`` (why) where Triton cannot run."""
    found = install()
    if isinstance(found, str):
        raise Unavailable(found)
    fill = {"SITE_PACKAGES": sysconfig.get_path("purelib"),
            "ENGINE_ARGS": json.dumps(engine_args(model))}  # fmt: skip
    # A cache of vLLM's own, empty: the model loads as on a machine that never ran vLLM
    # (its registry then inspects the model in a process of its own; ~/.cache hid that once).
    cold = {"VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    with running_triton(tmp, found, MODELS, fill, ready_s=START_S, env=cold) as server:
        yield server


def engine(server: TritonServer) -> dict[str, Any]:
    """The engine core's latest scheduler statistics, as the model wrote them."""
    path = server.records / "vllm_engine.json"
    return json.loads(path.read_text()) if path.exists() else {}


async def engine_idle(server: TritonServer, wait_s: float = 30.0) -> dict[str, Any]:
    """Waits until the engine core reports nothing running, waiting or held in its KV cache."""

    def idle() -> dict[str, Any]:
        stats = engine(server)
        held = (stats.get("running"), stats.get("waiting"), stats.get("kv_cache_usage"))
        return stats if held == (0, 0, 0.0) else {}  # empty, so false, until then

    return await wait_until(idle, wait_s, "the vLLM engine in Triton to be idle")


async def ended(server: TritonServer, prompt: str, wait_s: float = 60.0) -> dict[str, Any]:
    """The model's record of the request with ``prompt`` (HTTP generate carries no id)."""

    def found() -> dict[str, Any]:
        return server.ended(MODEL, by="prompt").get(prompt, {})

    return await wait_until(found, wait_s, f"vLLM in Triton to end {prompt[-40:]}")


def body(prompt: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    """A ``generate`` body: greedy, ``max_tokens`` tokens whatever the model says."""
    sampling = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    return {"text_input": prompt, "stream": stream, "sampling_parameters": json.dumps(sampling)}
