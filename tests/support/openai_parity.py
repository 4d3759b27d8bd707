"""The battery of the OpenAI parity test (``tests/vllm/test_vllm_openai_parity.py``): requests sent
to ``vllm serve`` and to the gateway on the same model, each answer reduced to what a client
reads (per choice: text, finish reason, log-probabilities; usage), and the comparison.

Each :class:`Case` says what is expected: ``same`` (both answer 200 with the same reading, floats
within tolerance), ``both_refuse`` (both 400), or ``gateway_refuses`` (the gateway answers 400
naming ``field``; what vLLM did is recorded for docs/openai-parity.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
PROMPT = "The quick brown fox"
HELLO = [{"role": "user", "content": "Hello world"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BIASED = "300"
"""A token id every case that biases toward one token uses."""
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict[str, Any]
    expect: str = "same"
    field: str = ""
    """``gateway_refuses``: the field the gateway names."""

    def full_body(self, model: str) -> dict[str, Any]:
        base: dict[str, Any] = {"model": model}
        if self.path == RESPONSES:
            base |= {"max_output_tokens": 8, "input": "Hello world"}
        else:
            base |= {"max_tokens": 8}
            base |= {"messages": HELLO} if self.path == CHAT else {"prompt": PROMPT}
        return {k: v for k, v in (base | self.body).items() if v is not _DROP}


_DROP = object()
G0 = {"temperature": 0}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def _c(name: str, expect: str = "same", fld: str = "", **body: Any) -> Case:
    return Case(name, COMPLETIONS, body, expect, fld)


def _h(name: str, expect: str = "same", fld: str = "", **body: Any) -> Case:
    return Case(name, CHAT, body, expect, fld)


def _r(name: str, expect: str = "same", fld: str = "", **body: Any) -> Case:
    return Case(name, RESPONSES, body, expect, fld)


CASES = [
    _c("greedy", **G0),
    _c("greedy, streamed", **G0, **STREAM),
    _c("seed", seed=7),
    _c("seed, streamed", seed=7, **STREAM),
    _c("n=2 with a seed", n=2, seed=7),
    _c("n=2 with a seed, streamed", n=2, seed=7, **STREAM),
    _c("top_k", top_k=5, seed=3),
    _c("min_p", min_p=0.1, seed=3),
    _c("top_p", top_p=0.5, seed=3),
    _c(
        "presence and frequency penalties",
        presence_penalty=1.5,
        frequency_penalty=1.0,
        max_tokens=24,
        **G0,
    ),
    _c("repetition_penalty", repetition_penalty=1.5, max_tokens=24, **G0),
    _c("logit_bias", logit_bias={BIASED: 100}, **G0),
    _c("stop_token_ids", logit_bias={BIASED: 100}, stop_token_ids=[int(BIASED)], **G0),
    _c(
        "stop_token_ids after min_tokens",
        logit_bias={BIASED: 100},
        stop_token_ids=[int(BIASED)],
        min_tokens=3,
        **G0,
    ),
    _c("stop string", stop=["e"], max_tokens=16, **G0),
    _c("stop string kept", stop=["e"], include_stop_str_in_output=True, max_tokens=16, **G0),
    _c(
        "stop string kept, streamed",
        stop=["e"],
        include_stop_str_in_output=True,
        max_tokens=16,
        **G0,
        **STREAM,
    ),
    _c("special token shown", logit_bias={"1": 100}, skip_special_tokens=False, max_tokens=3, **G0),
    _c("special token skipped", logit_bias={"1": 100}, max_tokens=3, **G0),
    _c("max_tokens 1", max_tokens=1, **G0),
    _c("logprobs 0", logprobs=0, **G0),
    _c("logprobs 3", logprobs=3, seed=5),
    _c("logprobs 3, streamed", logprobs=3, seed=5, **STREAM),
    _c("echo", echo=True, **G0),
    _c("echo, streamed", echo=True, **G0, **STREAM),
    _c("echo with logprobs", echo=True, logprobs=2, **G0),
    _c("prompt as token ids", prompt=[5, 6, 7, 8], **G0),
    _c("prompts as token id lists", prompt=[[5, 6], [7, 8, 9]], **G0),
    _c("prompts as strings", prompt=["Hello", "North south"], **G0),
    _c("token ids echoed", prompt=[40, 41, 42], echo=True, **G0),
    _c("metadata: user", user="someone", **G0),
    _c("suffix", "both_refuse", suffix="and then"),
    _c("logprobs over 20", "both_refuse", logprobs=21),
    _c("logit_bias out of the vocabulary", "both_refuse", logit_bias={"99999": 1}),
    _c("stream_options without stream", "both_refuse", stream_options={"include_usage": True}),
    _c("min_tokens over max_tokens", "both_refuse", min_tokens=9),
    _c("longer than the context", "both_refuse", max_tokens=9000),
    _c("response_format json_object", response_format={"type": "json_object"}, **G0),
    _c("structured_outputs choice", structured_outputs={"choice": ["yes", "no"]}, **G0),
    _c("structured_outputs regex", structured_outputs={"regex": "[a-z]{3,6}"}, seed=2),
    _c(
        "structured_outputs with a bad schema",
        "both_refuse",
        structured_outputs={"json": {"type": "nonsense"}},
    ),
    _c("beam search", "gateway_refuses", "use_beam_search", use_beam_search=True),
    _c("an unknown field", "gateway_refuses", "frobnicate", frobnicate=1),
    _c("bad_words", "gateway_refuses", "bad_words", bad_words=["fox"]),
    _c("guided_json (vLLM 0.32 drops it)", "gateway_refuses", "guided_json", guided_json={}),
    _h("greedy", **G0),
    _h("greedy, streamed", **G0, **STREAM),
    _h("seed", seed=9),
    _h("n=2 with a seed", n=2, seed=9),
    _h("logprobs, top 2", logprobs=True, top_logprobs=2, **G0),
    _h("logprobs, top 2, streamed", logprobs=True, top_logprobs=2, **G0, **STREAM),
    _h("logprobs, top 0", logprobs=True, seed=4),
    _h("logprobs with a seed, top 5", logprobs=True, top_logprobs=5, seed=4),
    _h("max_completion_tokens wins over max_tokens", max_completion_tokens=3, **G0),
    _h("penalties", presence_penalty=1.0, frequency_penalty=0.5, max_tokens=24, **G0),
    _h("stop string", stop=["a"], max_tokens=16, **G0),
    _h(
        "text parts",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}],
            }
        ],
        **G0,
    ),
    _h("a name on a message", messages=[{"role": "user", "content": "Hi", "name": "ann"}], **G0),
    _h(
        "a tool message",
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
        **G0,
    ),
    _h("no generation prompt", add_generation_prompt=False, **G0),
    _h(
        "continue the final message",
        add_generation_prompt=False,
        continue_final_message=True,
        messages=[*HELLO, {"role": "assistant", "content": "Hi the"}],
        **G0,
    ),
    _h("chat_template_kwargs", chat_template_kwargs={"unused": 1}, **G0),
    _h("metadata", user="someone", metadata={"k": "v"}, store=False, **G0),
    _h("top_logprobs 1000", "both_refuse", logprobs=True, top_logprobs=1000),
    _h("top_logprobs without logprobs", "both_refuse", top_logprobs=2),
    _h("continue and generation prompt", "both_refuse", continue_final_message=True),
    _h("tools without a tool-call parser", "both_refuse", tools=[TOOL]),
    _h(
        "a named tool_choice without a tool-call parser",
        "both_refuse",
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "f"}},
    ),
    _h("tools with tool_choice none", tools=[TOOL], tool_choice="none", **G0),
    _h("tool_choice without tools", "both_refuse", tool_choice="required"),
    _h("parallel_tool_calls without tools", parallel_tool_calls=False, **G0),
    _h(
        "response_format json_schema",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        **G0,
    ),
    _h(
        "response_format json_schema, streamed",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        **G0,
        **STREAM,
    ),
    _h("structured_outputs choice", structured_outputs={"choice": ["yes", "no"]}, **G0),
    _h("response_format yaml", "both_refuse", response_format={"type": "yaml"}),
    _h("functions (deprecated)", "gateway_refuses", "functions", functions=[TOOL["function"]]),
    _h(
        "an image part",
        "gateway_refuses",
        "messages",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
                ],
            }
        ],
    ),
    _h("echo", "gateway_refuses", "echo", echo=True),
    _r("greedy", **G0),
    _r("greedy, streamed", stream=True, **G0),
    _r("instructions", instructions="Answer in French.", **G0),
    _r("instructions, streamed", instructions="Answer in French.", stream=True, **G0),
    _r(
        "input as message items",
        input=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there"},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        ],
        **G0,
    ),
    _r("max_output_tokens 1", max_output_tokens=1, **G0),
    _r("top_p with a seed", top_p=0.5, seed=3),
    _r("vLLM's top_k and repetition_penalty", top_k=5, repetition_penalty=1.5, seed=3),
    _r("stop string", stop=["a"], max_output_tokens=16, **G0),
    _r(
        "text.format json_schema",
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        max_output_tokens=16,
        **G0,
    ),
    _r("metadata", metadata={"k": "v"}, user="someone", **G0),
    _r("store false", store=False, **G0),
    _r("temperature over 2", "both_refuse", temperature=3),
    _r("an unknown field", "gateway_refuses", "frobnicate", frobnicate=1),
    _r("reasoning", "gateway_refuses", "reasoning", reasoning={"effort": "low"}),
    _r("top_logprobs", "gateway_refuses", "top_logprobs", top_logprobs=2),
]


@dataclass
class Reading:
    """What a client reads from one answer."""

    status: int
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    error: dict[str, Any] | None = None
    terminal: str = ""
    """A streamed Responses call: the type of the event that ended it ("" if none did)."""


async def read(session: aiohttp.ClientSession, url: str, case: Case, model: str) -> Reading:
    body = case.full_body(model)
    async with session.post(url + case.path, json=body) as resp:
        if resp.status != 200:
            answer = await resp.json()
            return Reading(resp.status, error=answer.get("error"))
        responses = case.path == RESPONSES
        if not body.get("stream"):
            answer = await resp.json()
            return _response(answer) if responses else _whole(answer, chat=case.path == CHAT)
        reading = Reading(200)
        async for line in resp.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                event = json.loads(line[6:])
                if responses:
                    _absorb_event(reading, event)
                else:
                    _absorb(reading, event, chat=case.path == CHAT)
        return reading


def _response(answer: dict[str, Any]) -> Reading:
    """A Responses API response object: its output text, how it ended, its usage."""
    text = "".join(
        part.get("text", "")
        for item in answer.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )
    incomplete = (answer.get("incomplete_details") or {}).get("reason")
    ended = f"{answer.get('status')}" + (f" ({incomplete})" if incomplete else "")
    usage = answer.get("usage") or {}
    names = ("input_tokens", "output_tokens", "total_tokens")
    counts = {k: int(usage[k]) for k in names if k in usage} or None  # a gap is a difference
    return Reading(200, {0: {"text": text, "finish": ended, "logprobs": None}}, counts)


def _absorb_event(reading: Reading, event: dict[str, Any]) -> None:
    """One Responses streaming event: text deltas, then the final response's status and usage
    (its text must be the deltas')."""
    kind = event.get("type", "")
    seen = reading.choices.setdefault(0, {"text": "", "finish": None, "logprobs": None})
    if kind == "response.output_text.delta":
        seen["text"] += event.get("delta", "")
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        reading.terminal = kind
        final = _response(event.get("response") or {})
        if final.choices[0]["text"] != seen["text"]:
            seen["finish"] = f"final text {final.choices[0]['text']!r} is not the deltas'"
        else:
            seen["finish"] = final.choices[0]["finish"]
        reading.usage = final.usage
    elif kind == "error":
        reading.status, reading.error = 500, event


def _whole(answer: dict[str, Any], *, chat: bool) -> Reading:
    reading = Reading(200, usage=_usage(answer["usage"]))
    for choice in answer["choices"]:
        text = choice["message"]["content"] if chat else choice["text"]
        reading.choices[choice["index"]] = {"text": text, "finish": choice["finish_reason"],
                                            "logprobs": choice["logprobs"]}  # fmt: skip
    return reading


def _absorb(reading: Reading, event: dict[str, Any], *, chat: bool) -> None:
    if event.get("error"):
        reading.status, reading.error = 500, event["error"]
    if event.get("usage"):
        reading.usage = _usage(event["usage"])
    for choice in event.get("choices", []):
        empty = {"text": "", "finish": None, "logprobs": None}
        seen = reading.choices.setdefault(choice["index"], empty)
        text = (choice["delta"].get("content") if chat else choice["text"]) or ""
        seen["text"] += text
        seen["finish"] = choice.get("finish_reason") or seen["finish"]
        if choice.get("logprobs"):
            seen["logprobs"] = _extend(seen["logprobs"], choice["logprobs"])


def _extend(have: dict[str, list[Any]] | None, more: dict[str, list[Any]]) -> dict[str, Any]:
    if have is None:
        return {k: list(v) for k, v in more.items()}
    for key, values in more.items():
        have[key] = [*have[key], *values]
    return have


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    return {k: int(usage[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def differences(theirs: Reading, ours: Reading) -> list[str]:
    """What a client would notice between the two readings (empty when they agree)."""
    if (theirs.status, ours.status) != (200, 200):
        return [f"status {theirs.status} vs {ours.status}: {theirs.error} / {ours.error}"]
    found = []
    if theirs.usage != ours.usage:
        found.append(f"usage {theirs.usage} vs {ours.usage}")
    if sorted(theirs.choices) != sorted(ours.choices):
        return [*found, f"choices {sorted(theirs.choices)} vs {sorted(ours.choices)}"]
    for index, mine in theirs.choices.items():
        other = ours.choices[index]
        for key in ("text", "finish"):
            if mine[key] != other[key]:
                found.append(f"choice {index} {key}: {mine[key]!r} vs {other[key]!r}")
        if not close(mine["logprobs"], other["logprobs"]):
            found.append(f"choice {index} logprobs: {mine['logprobs']} vs {other['logprobs']}")
    return found


def close(a: Any, b: Any) -> bool:
    """Equal, floats within :data:`TOLERANCE`."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        return numbers and math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
