"""Structured output and tools with the vLLM engine, side by side with ``vllm serve``.

One ``vllm serve`` and one one-worker gateway run the tiny model with the same engine options
and ``--tool-call-parser hermes --enable-auto-tool-choice``. Every request goes to both with the
real ``openai`` client, at temperature 0, streamed and not: the same text, tool calls (names and
arguments), finish reason and token counts, and the same refusals. The tiny model is random, so
a named or ``"required"`` tool choice shows vLLM's constraint at work (the answer opens with the
``<tool_call>`` envelope naming the tool) more than a finished call; an ``"auto"`` choice held to
a regex makes a whole call that the parser turns into ``tool_calls`` with ``finish_reason:
"tool_calls"``. A client that hangs up in such a stream is a cancellation like any other.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import uuid
import warnings
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.base.processes import Process, enter_together
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import (
    ENGINE_ARGS,
    MODEL,
    WAIT_S,
    calls_in_flight,
    engines_idle,
    vllm_gateway,
    vllm_serve,
)
from gateway_server.engine.base import EngineError, RequestRejected
from gateway_server.engine.tools import ToolSettings
from gateway_server.engine.vllm.tools import VllmToolCalling
from tests.support.vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

TOOL_ARGS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False},
}}  # fmt: skip
TIME = {"type": "function", "function": {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                   "required": ["zone"]},
}}  # fmt: skip
CALL_TIME = r'<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}\n</tool_call>'
COLOURS = ["red", "green", "blue"]
SCHEMA = {"type": "object", "properties": {"colour": {"enum": COLOURS}}, "required": ["colour"]}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
AFTER_A_CALL = [
    {"role": "user", "content": "What time is it?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }]},
    {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
]  # fmt: skip
"""A second turn: the assistant's earlier tool call and the tool's answer, in the prompt."""

STRUCTURED = {
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "colour", "schema": SCHEMA}}},
    "text": {"response_format": {"type": "text"}},
    "choice": {"structured_outputs": {"choice": COLOURS}},
    "regex": {"structured_outputs": {"regex": "(red|blue) [0-9]{2}"}},
    "grammar": {"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
    "json": {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
}  # fmt: skip
TOOLS = {
    "named": {"tools": [WEATHER, TIME], "tool_choice": NAMED},
    "required": {"tools": [WEATHER, TIME], "tool_choice": "required"},
    "none": {"tools": [WEATHER, TIME], "tool_choice": "none"},
    "auto_regex": {"tools": [TIME], "structured_outputs": {"regex": CALL_TIME}, "max_tokens": 120},
    "auto_single": {"tools": [TIME], "tool_choice": "auto", "parallel_tool_calls": False,
                    "structured_outputs": {"regex": CALL_TIME}, "max_tokens": 120},
    "after_a_call": {"tools": [TIME], "tool_choice": "auto", "messages": AFTER_A_CALL},
    "after_a_call_required": {"tools": [TIME], "tool_choice": "required",
                              "messages": AFTER_A_CALL},
}  # fmt: skip
REFUSED = {
    "two_kinds": {"structured_outputs": {"regex": "a", "choice": ["a"]}},
    "schema_missing": {"response_format": {"type": "json_schema"}},
    "bad_schema": {"structured_outputs": {"json": {"type": "nonsense"}}},
    "bad_grammar": {"structured_outputs": {"grammar": "root ::= = broken"}},
    "constraint_and_named_tool": {"tools": [WEATHER], "tool_choice": NAMED,
                                  "structured_outputs": {"regex": "a"}},
    "empty_tools": {"tools": []},
    "unknown_tool": {"tools": [TIME], "tool_choice": NAMED},
    "choice_without_tools": {"tool_choice": "required"},
}  # fmt: skip
CLIENT_ARGS = ("max_tokens", "temperature", "tools", "tool_choice", "response_format",
               "parallel_tool_calls")  # fmt: skip
"""Fields the openai client takes by name; the others (``structured_outputs``) go in its body."""
Answer = tuple[Any, ...]


@pytest.fixture(scope="module")
def both(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Process]]:
    """``vllm serve`` and a one-worker gateway, each with the tool parser, started side by side."""
    with contextlib.ExitStack() as stack:
        served, gateway = enter_together(
            stack,
            vllm_serve(tiny_model, tmp_path_factory.mktemp("vllm-serve-tools"),
                       [*ENGINE_ARGS, *TOOL_ARGS]),
            vllm_gateway(tiny_model, tmp_path_factory.mktemp("vllm-gateway-tools"), workers=1,
                         extra=TOOL_ARGS),
        )  # fmt: skip
        yield served, gateway


@pytest.fixture(scope="module")
def served(both: tuple[str, Process]) -> str:
    return both[0]


@pytest.fixture(scope="module")
def tool_gateway(both: tuple[str, Process]) -> Process:
    return both[1]


@pytest.fixture(scope="module")
def clients(served: str, tool_gateway: Process) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    """(``vllm serve``'s client, the gateway's client)."""
    made = [openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
            for url in (served, tool_gateway.url())]  # fmt: skip
    yield made[0], made[1]
    for client in made:
        client.close()


def chat(client: openai.OpenAI, extra: dict[str, Any], *, stream: bool) -> Answer:
    """(content, [(tool name, arguments)], finish reason, prompt tokens, completion tokens), or
    (400, message) for a refusal."""
    body = {"max_tokens": 40, "temperature": 0, **extra}
    known = {name: body.pop(name) for name in CLIENT_ARGS if name in body}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    messages: Any = body.pop("messages", asked)
    try:
        if not stream:
            whole = client.chat.completions.create(
                model=MODEL, messages=messages, extra_body=body, **known
            )
            choice, usage = whole.choices[0], whole.usage
            assert usage is not None
            calls = [
                (c.function.name, c.function.arguments) for c in choice.message.tool_calls or []
            ]
            return (choice.message.content, calls, choice.finish_reason, usage.prompt_tokens,
                    usage.completion_tokens)  # fmt: skip
        return _streamed(client, messages, known, body)
    except openai.BadRequestError as exc:
        return 400, exc.body["message"] if isinstance(exc.body, dict) else str(exc.body)


def _streamed(
    client: openai.OpenAI, messages: Any, known: dict[str, Any], body: dict[str, Any]
) -> Answer:
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True},
        extra_body=body, **known,
    )  # fmt: skip
    text, calls, finish, usage = "", dict[int, list[str]](), None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name_args = calls.setdefault(call.index, ["", ""])
                name_args[0] += (call.function and call.function.name) or ""
                name_args[1] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    assert usage is not None
    pairs = [(name, args) for _, (name, args) in sorted(calls.items())]
    return text or None, pairs, finish, usage.prompt_tokens, usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", list(STRUCTURED))
def test_structured_output_answers_as_vllm_serve_does(
    clients: tuple[openai.OpenAI, openai.OpenAI], case: str, stream: bool
) -> None:
    theirs, ours = (chat(client, STRUCTURED[case], stream=stream) for client in clients)
    assert ours == theirs
    content = ours[0]
    if case == "choice":
        assert content in COLOURS  # the constraint held: not free text
    elif case == "grammar":
        assert content in ("yes", "no")
    elif case.startswith("json"):
        assert content.startswith("{")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_take_structured_output_as_vllm_serve_does(
    served: str, tool_gateway: Process, stream: bool
) -> None:
    body = {"model": MODEL, "prompt": "Pick a colour:", "max_tokens": 20, "temperature": 0,
            "structured_outputs": {"regex": "(red|blue) [0-9]{2}"}, "stream": stream}  # fmt: skip
    answers = []
    for url in (served, tool_gateway.url()):
        with httpx.Client(timeout=300) as http:
            resp = http.post(url + "/v1/completions", json=body)
        assert resp.status_code == 200
        answers.append(_completion_text(resp.text) if stream else resp.json()["choices"][0]["text"])
    assert answers[0] == answers[1]
    assert answers[1].split(" ")[0] in ("red", "blue")


def _completion_text(events: str) -> str:
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    return "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", list(TOOLS))
def test_tools_answer_as_vllm_serve_does(
    clients: tuple[openai.OpenAI, openai.OpenAI], case: str, stream: bool
) -> None:
    theirs, ours = (chat(client, TOOLS[case], stream=stream) for client in clients)
    assert ours == theirs
    content, calls, finish = ours[:3]
    if case.startswith("auto"):
        assert calls == [("get_time", '{"zone": "UTC"}')]
        assert finish == "tool_calls" and not content
    elif case == "named":  # constrained to the named tool's envelope
        named = [name for name, _ in calls] or [content[: len('<tool_call>{"name": "get_weather"')]]
        assert named in (["get_weather"], ['<tool_call>{"name": "get_weather"'])
    elif case == "required":
        assert calls or content.startswith("<tool_call>")


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_are_vllm_serves(clients: tuple[openai.OpenAI, openai.OpenAI], case: str) -> None:
    theirs, ours = (chat(client, REFUSED[case], stream=False) for client in clients)
    assert ours[0] == theirs[0] == 400, (ours, theirs)
    assert ours[1] in theirs[1]  # vLLM's words (it may add "(parameter=...)")


def test_a_bad_schema_streamed_is_refused_before_the_stream(
    clients: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """Where the gateway differs: ``vllm serve`` answers 200 and puts the error in the stream;
    the gateway checks the schema with the same vLLM code before answering, and refuses."""
    extra = REFUSED["bad_schema"]
    theirs_client, ours_client = clients
    with pytest.raises(openai.APIError) as theirs:
        chat(theirs_client, extra, stream=True)
    ours = chat(ours_client, extra, stream=True)
    assert ours[0] == 400
    assert ours[1] in str(theirs.value)


@pytest.fixture(scope="module")
def renderer_source() -> str:
    """The source of vLLM's chat renderer, where ``vllm serve`` refuses tool choices; vLLM is
    imported here as the gateway imports it (torch warns of deprecations while it loads)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in ("vllm.entrypoints.openai.chat_completion.protocol", "vllm.parser"):
            import_module(name)
        return inspect.getsource(import_module("vllm.renderers.online_renderer"))


@pytest.mark.parametrize("settings", [ToolSettings(), ToolSettings("hermes", auto=False)])
@pytest.mark.parametrize(
    ("choice", "refusal"),
    [
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (NAMED, 'tool_choice=function "get_weather" requires --tool-call-parser to be set'),
    ],
)
def test_without_auto_tool_choice_tools_are_refused_where_vllm_serve_refuses(
    renderer_source: str, settings: ToolSettings, choice: Any, refusal: str
) -> None:
    """``vllm serve`` uses its tool parser only with --enable-auto-tool-choice; without one, it
    refuses every tool choice but "none". Its words, read from its source, not from memory."""
    assert refusal.split(" requires ")[1] in renderer_source
    calling = VllmToolCalling(settings, tokenizer=object())
    with pytest.raises(RequestRejected) as refused:
        calling.plan({"tools": [WEATHER], "tool_choice": choice})
    assert refusal in str(refused.value) and refused.value.param == "tool_choice"
    plan = calling.plan({"tools": [WEATHER], "tool_choice": "none"})
    assert plan is not None and not plan.parses and plan.tool_dicts is not None


def test_an_unknown_tool_parser_is_an_error_at_start(renderer_source: str) -> None:
    with pytest.raises(
        EngineError, match=r"--tool-call-parser no-such-parser: .*not been registered"
    ):
        VllmToolCalling(ToolSettings("no-such-parser", auto=True), tokenizer=object())


@pytest.mark.parametrize(
    "extra",
    [{"response_format": {"type": "json_object"}}, {"tools": [WEATHER], "tool_choice": NAMED}],
    ids=["structured", "tool_call"],
)
def test_a_hang_up_in_the_stream_is_a_cancellation(
    tool_gateway: Process, extra: dict[str, Any]
) -> None:
    gateway, call_id = tool_gateway, uuid.uuid4().hex
    before = scrape(gateway.url())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
            "max_tokens": 4000, "stream": True, **extra}  # fmt: skip
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", gateway.url() + "/v1/chat/completions", json=body,
                    headers={"X-Request-Id": call_id}) as resp,
    ):  # fmt: skip
        assert resp.status_code == 200
        poll_until(lambda: _tokens(gateway, call_id) >= 10, WAIT_S, "the call to be decoding")
    # Leaving the block closes the connection mid-stream: the client hung up.

    def counted() -> bool:
        grown = _cancelled(scrape(gateway.url())) - _cancelled(before)
        return grown == 1

    poll_until(counted, WAIT_S, "the hang-up counted as a cancellation in decode")
    poll_until(lambda: not calls_in_flight(gateway), WAIT_S, "nothing in flight")
    poll_until(lambda: engines_idle(gateway), WAIT_S, "the engine to free the slot")


def _tokens(gateway: Process, call_id: str) -> int:
    calls = [c for c in calls_in_flight(gateway) if c["request_id"] == call_id]
    return int(calls[0]["generated_tokens"]) if calls else 0


def _cancelled(samples: Any) -> float:
    return total(samples, "hangup_gateway_cancellations_total", model=MODEL,
                 reason="client_disconnect", phase="decode")  # fmt: skip
