"""Two vLLM engines handing a prompt's KV over through hangup's connector, as a script the vLLM
tier runs in a process of its own (vLLM spawns its engine cores from it; pytest's warning
filters stay out of vLLM's way). Prints one JSON object: what the test asserts on.

``python -m tests.support.kv_handoff_probe MODEL STORE_DIR``

Worker 0 prefills, worker 1 decodes; both have prefix caching off, so every prompt token that
worker 1 did not compute came from the handoff.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

from gateway_server.engine.base import EngineRequest, SamplingParams
from gateway_server.engine.vllm.kv_handoff import PARAM_KEY, HandoffStore
from gateway_server.engine.vllm.options import VllmOptions
from gateway_server.engine.vllm.pd import VllmPdEngine

PROMPT = "The quick brown fox jumps over the lazy dog. " * 20  # 461 tokens
OTHER = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday. " * 20
OPTIONS = VllmOptions(
    enforce_eager=True,
    kv_cache_memory_bytes=256 << 20,
    max_model_len=2048,
    max_num_batched_tokens=64,  # the prompts are prefilled in several chunks
    enable_prefix_caching=False,
)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


async def text(engine: VllmPdEngine, request: EngineRequest, handoff: Any = None) -> str:
    stream = engine.generate(request) if handoff is None else engine.decode(request, handoff)
    return "".join([chunk.text async for chunk in stream])


def zero_handoff(path: Path) -> None:
    """Overwrite a handoff file's KV with zeros, its header (tokens, prompt digest) kept."""
    safetensors: Any = import_module("safetensors")
    storage: Any = import_module("safetensors.torch")
    with safetensors.safe_open(str(path), "pt") as f:
        meta = f.metadata()
        zeros = {name: f.get_tensor(name).zero_() for name in f.keys()}  # noqa: SIM118 (not a dict)
    storage.save_file(zeros, str(path), metadata=meta)


def idle(engine: VllmPdEngine) -> bool:
    load = engine.load()
    return load.running == 0 and load.waiting == 0 and load.kv_cache_usage == 0.0


async def probe(model: str, store: HandoffStore) -> dict[str, Any]:
    prefill = VllmPdEngine(model, OPTIONS, store, index=0)
    decode = VllmPdEngine(model, OPTIONS, store, index=1)
    await prefill.start()
    await decode.start()
    try:
        out: dict[str, Any] = {"block_size": decode.load().block_size}
        out["prompt_tokens"] = decode.count_prompt_tokens(PROMPT)
        out["aggregated"] = await text(decode, EngineRequest("agg", PROMPT, GREEDY))
        handoff = await prefill.prefill(EngineRequest("p1", PROMPT, GREEDY), "call-1")
        out["held_after_prefill"] = store.holding().blocks
        out["handoff_blocks"] = prefill.handoff_blocks()
        out["pd"] = await text(decode, EngineRequest("d1", PROMPT, GREEDY), handoff)
        out["loaded"] = decode.loaded_tokens_total
        out["held_after_decode"] = store.holding().files
        # A handoff released before decode (a cancel in transfer): decode finds nothing to load.
        out["other_aggregated"] = await text(decode, EngineRequest("agg2", OTHER, GREEDY))
        released = await prefill.prefill(EngineRequest("p2", OTHER, GREEDY), "call-2")
        out["released_blocks"] = await prefill.release("call-2")
        out["held_after_release"] = store.holding().files
        out["other_pd"] = await text(decode, EngineRequest("d2", OTHER, GREEDY), released)
        out["loaded_after_release"] = decode.loaded_tokens_total - out["loaded"]
        # The control: the same handoff with its KV zeroed is loaded just the same, and the
        # answer changes, so the answers above came from the KV that was handed over.
        zeroed = await prefill.prefill(EngineRequest("p3", PROMPT, GREEDY), "call-3")
        zero_handoff(store.path(zeroed.transfer_params[PARAM_KEY]))
        before = decode.loaded_tokens_total
        out["zeroed_pd"] = await text(decode, EngineRequest("d3", PROMPT, GREEDY), zeroed)
        out["zeroed_loaded"] = decode.loaded_tokens_total - before
        # A damaged handoff (its header whole, its data cut short) cannot be loaded: decode
        # computes those blocks instead, answers the same, and the engine lives on.
        damaged = await prefill.prefill(EngineRequest("p4", PROMPT, GREEDY), "call-4")
        path = store.path(damaged.transfer_params[PARAM_KEY])
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        out["damaged_pd"] = await text(decode, EngineRequest("d4", PROMPT, GREEDY), damaged)
        out["damaged_alive"] = decode.alive
        await prefill.release("call-4")
        out["idle"] = [idle(prefill), idle(decode)]
        return out
    finally:
        await prefill.shutdown()
        await decode.shutdown()


def main() -> None:
    model, root = sys.argv[1], Path(sys.argv[2])
    result = asyncio.run(probe(model, HandoffStore(root)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
