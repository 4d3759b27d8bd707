"""What the vLLM engine hands to ``AsyncLLM.add_request``: the prompt and vLLM's sampling
parameters, built from the engine-neutral request (vLLM imported when first used)."""

from __future__ import annotations

import json
from importlib import import_module
from typing import Any

from gateway_server.engine.base import EngineRequest, SamplingParams
from gateway_server.engine.constraint import Constraint, StructuredOutput


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
            else vllm_sampling.StructuredOutputsParams(
                **structured_outputs_kwargs(params.structured)
            )
        ),
    )


def structured_outputs_kwargs(spec: StructuredOutput) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``StructuredOutputsParams`` (a schema as an object,
    as ``vllm serve`` passes it)."""
    value: Any = spec.value
    if spec.kind is Constraint.JSON:
        value = json.loads(str(value))
    elif spec.kind is Constraint.CHOICE:
        value = list(spec.value)  # type: ignore[arg-type]
    args: dict[str, Any] = {spec.kind.value: value}
    args.update(
        disable_any_whitespace=spec.disable_any_whitespace,
        disable_additional_properties=spec.disable_additional_properties,
        whitespace_pattern=spec.whitespace_pattern,
    )
    return args


def from_vllm(params: Any, source: str) -> StructuredOutput | None:
    """The spec of vLLM's ``StructuredOutputsParams`` (None for None): what vLLM's tool parsers
    set when they constrain a request; ``source`` names the field it answers to."""
    if params is None:
        return None
    for kind in Constraint:
        value = getattr(params, kind.value, None)
        if value is None:
            continue
        if kind is Constraint.JSON and not isinstance(value, str):
            value = json.dumps(value)
        elif kind is Constraint.CHOICE:
            value = tuple(value)
        return StructuredOutput(
            kind,
            value,
            source,
            disable_any_whitespace=bool(params.disable_any_whitespace),
            disable_additional_properties=bool(params.disable_additional_properties),
            whitespace_pattern=params.whitespace_pattern,
        )
    return None
