"""The Responses API on the shared vLLM gateway (tiny local model), with the openai client: the
text of a response is the chat completion's for the same prompt at temperature 0 (plain,
streamed, and with ``text.format`` through the chat path's structured output), and a cancel of
a streaming response frees the engine; and every field vLLM's Responses server or the openai
client knows is in the gateway's table (honoured, metadata or refused by name)."""

from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path

import pytest
from openai.types.responses import response_create_params

from bench.base.processes import Process
from bench.base.scrape import scrape, total
from bench.base.waiting import poll_until
from bench.harness.vllm_stack import IGNORE_EOS, MODEL, WAIT_S, engines_idle
from gateway_server.openai.responses.request import RESPONSES
from tests.support.vllm_fixtures import OpenAIFor, requires_vllm

# The first test may be the one that starts the shared vLLM gateway: over 300 s on a loaded machine.
pytestmark = [pytest.mark.vllm, requires_vllm, pytest.mark.timeout(900)]

PROMPT = "Name three colours."
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def test_every_field_vllm_or_openai_knows_is_in_the_table() -> None:
    openai_fields = typing.get_type_hints(response_create_params.ResponseCreateParamsBase)
    assert set(_vllm_responses_fields()) - set(RESPONSES) == set()
    assert set(openai_fields) - set(RESPONSES) == set()


def _vllm_responses_fields() -> list[str]:
    """The fields of vLLM's ``ResponsesRequest``, read from its source (importing vLLM here
    would cost tens of seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "entrypoints/openai/responses/protocol.py"
    tree = ast.parse(source.read_text())
    (request,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ResponsesRequest"
    ]
    names = [
        s.target.id
        for s in request.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]
    assert len(names) > 40, names  # the class was found whole
    return names


def test_response_text_is_the_chat_completions(gateway: Process, client_for: OpenAIFor) -> None:
    api = client_for(gateway)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    chat = api.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
    )
    made = api.responses.create(
        model=MODEL, instructions="Be brief.", input=PROMPT, max_output_tokens=16, temperature=0
    )
    stream = api.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input=PROMPT,
        max_output_tokens=16,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    assert made.output_text == chat.choices[0].message.content != ""
    assert made.usage is not None and chat.usage is not None
    assert made.usage.input_tokens == chat.usage.prompt_tokens
    assert made.usage.output_tokens == chat.usage.completion_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == made.output_text
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_text_format_is_the_chat_response_format(gateway: Process, client_for: OpenAIFor) -> None:
    api = client_for(gateway)
    chat = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=32,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    )
    made = api.responses.create(
        model=MODEL,
        input=PROMPT,
        max_output_tokens=32,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": SCHEMA}},
    )
    free = api.responses.create(model=MODEL, input=PROMPT, max_output_tokens=32, temperature=0)
    assert made.output_text == chat.choices[0].message.content
    assert made.output_text.startswith("{") and '"colour"' in made.output_text
    assert free.output_text != made.output_text  # the format constrained the answer


def test_cancel_of_a_streaming_response_frees_the_engine(
    gateway: Process, client_for: OpenAIFor
) -> None:
    api = client_for(gateway)
    before = scrape(gateway.url())
    stream = api.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=4000, stream=True, extra_body=IGNORE_EOS
    )
    events = iter(stream)
    created = next(events)
    assert created.type == "response.created"
    response_id = created.response.id  # type: ignore[union-attr]
    next(e for e in events if e.type == "response.output_text.delta")  # decoding
    cancelled = api.responses.cancel(response_id)
    rest = list(events)
    assert cancelled.status == "cancelled"
    assert rest[-1].type == "response.incomplete"
    assert rest[-1].response.status == "cancelled"  # type: ignore[union-attr]
    assert all(e.type == "response.output_text.delta" for e in rest[:-1])
    after = poll_until(lambda: engines_idle(gateway), WAIT_S, "the engines to be idle")
    name = "hangup_gateway_cancellations_total"
    counted = total(after, name, model=MODEL, reason="explicit") - total(
        before, name, model=MODEL, reason="explicit"
    )
    assert counted == 1
    assert total(after, name, model=MODEL, reason="explicit", phase="decode") > total(
        before, name, model=MODEL, reason="explicit", phase="decode"
    )
