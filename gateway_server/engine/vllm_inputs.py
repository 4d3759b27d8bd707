"""What the vLLM engine hands to ``AsyncLLM.add_request``: the prompt and vLLM's sampling
parameters, built from the engine-neutral request (vLLM imported when first used)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gateway_server.engine.base import EngineRequest, SamplingParams


def prompt_input(request: EngineRequest) -> Any:
    """The prompt as ``AsyncLLM.add_request`` takes it: text, or token ids."""
    if isinstance(request.prompt, tuple):
        return {"prompt_token_ids": list(request.prompt)}
    return request.prompt


def sampling_params(params: SamplingParams) -> Any:
    """vLLM's ``SamplingParams`` for ``params``, outputs as deltas (each new token once)."""
    vllm_sampling: Any = import_module("vllm.sampling_params")
    return vllm_sampling.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        min_tokens=params.min_tokens,
        logit_bias=dict(params.logit_bias) or None,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
        ignore_eos=params.ignore_eos,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        output_kind=vllm_sampling.RequestOutputKind.DELTA,
        structured_outputs=(
            None
            if params.structured is None
            else vllm_sampling.StructuredOutputsParams(**params.structured.vllm_kwargs())
        ),
    )
