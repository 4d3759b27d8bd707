"""Structured output and tools with the simulated engine: refused by name with 400, never
answered 200 with free text; the request parsing refuses what ``vllm serve`` refuses whatever
the engine. (The vLLM engine honours them: tests/vllm/test_vllm_structured_tools.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from gateway_server.config import from_args
from hangup_contract.runtime.options import ConfigError
from tests.support.gateway import MODEL, Gateway

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def post(gateway: Gateway, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with gateway.session.post(f"{gateway.url}/v1/{path}", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "extra", "needle"),
    [
        ("chat/completions", {"response_format": {"type": "json_object"}}, "'response_format'"),
        ("completions", {"response_format": {"type": "json_object"}}, "'response_format'"),
        ("chat/completions", {"structured_outputs": {"regex": "[a-z]+"}}, "'structured_outputs'"),
        ("completions", {"structured_outputs": {"choice": ["a", "b"]}}, "'structured_outputs'"),
        ("chat/completions", {"tools": TOOLS}, "'tools'"),
        ("chat/completions", {"tools": TOOLS, "tool_choice": "none"}, "'tools'"),
        ("chat/completions", {"tool_choice": "required"}, "'tool_choice'"),
    ],
)
async def test_the_simulation_refuses_structured_output_and_tools_by_name(
    gateway: Gateway, path: str, extra: dict[str, Any], needle: str, stream: bool
) -> None:
    body = {**CHAT, **extra, "stream": stream}
    if path == "completions":
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **extra, "stream": stream}
    status, answer = await post(gateway, path, body)
    assert status == 400, answer
    message = answer["error"]["message"]
    assert needle in message and "not supported by the simulated engine" in message
    assert gateway.requests("completed") == 0


async def test_response_format_text_is_plain_text(gateway: Gateway) -> None:
    plain = await post(gateway, "chat/completions", CHAT)
    text = await post(gateway, "chat/completions", {**CHAT, "response_format": {"type": "text"}})
    assert plain[0] == text[0] == 200
    assert text[1]["choices"][0]["message"] == plain[1]["choices"][0]["message"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"response_format": {"type": "json_schema"}}, "'json_schema' field must be provided"),
        ({"response_format": {"type": "yaml"}}, "'text', 'json_object' or 'json_schema'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "json_schema.schema"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "only use one kind"),
        ({"structured_outputs": {"regex": "a", "grammar": "root ::= x"}}, "only one kind"),
        ({"structured_outputs": {"json": "{not json"}}, "not valid JSON"),
        ({"structured_outputs": {"choice": []}}, "non-empty array"),
        ({"structured_outputs": {}}, "one kind of constraint"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "two kinds"),
        ({"structured_outputs": {"regex": "a"}, "tools": TOOLS,
          "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
         "structured outputs or tools, not both"),
    ],
)  # fmt: skip
async def test_bad_structured_output_is_refused_before_the_engine(
    gateway: Gateway, extra: dict[str, Any], needle: str
) -> None:
    status, answer = await post(gateway, "chat/completions", {**CHAT, **extra})
    assert status == 400
    assert needle in answer["error"]["message"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
        (["--tool-call-parser", "hermes"], "--tool-call-parser needs --engine vllm"),
    ],
)
def test_tool_options_are_checked_at_start(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        from_args(argv, environ={})


def test_tool_options_read_the_environment(tmp_path: Any) -> None:
    environ = {"HANGUP_GATEWAY_TOOL_CALL_PARSER": "hermes",
               "HANGUP_GATEWAY_ENABLE_AUTO_TOOL_CHOICE": "true"}  # fmt: skip
    config = from_args(["--engine", "vllm", "--model", str(tmp_path)], environ=environ)
    assert (config.tool_call_parser, config.enable_auto_tool_choice) == ("hermes", True)
