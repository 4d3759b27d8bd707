"""``response_format`` and ``structured_outputs`` read into one constraint, and the keyword
arguments vLLM's ``StructuredOutputsParams`` gets from it (no vLLM needed)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway_server.engine.constraint import Constraint, StructuredOutput
from gateway_server.engine.vllm.inputs import structured_outputs_kwargs
from gateway_server.errors import InvalidRequest
from gateway_server.openai.structured import parse_structured

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
OPTIONS_OFF = {"disable_any_whitespace": False, "disable_additional_properties": False,
               "whitespace_pattern": None}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "kwargs"),
    [
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a",
                                                                     "schema": SCHEMA}}},
         {"json": SCHEMA}),
        ({"structured_outputs": {"json": '{"type": "object"}'}}, {"json": {"type": "object"}}),
        ({"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}),
        ({"structured_outputs": {"regex": ""}}, {"regex": ""}),  # vLLM compiles an empty regex
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}),
    ],
)  # fmt: skip
def test_each_kind_reaches_vllm_as_vllm_serve_sends_it(
    body: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    spec = parse_structured(body)
    assert spec is not None and structured_outputs_kwargs(spec) == kwargs | OPTIONS_OFF


def test_text_and_nothing_are_no_constraint() -> None:
    assert parse_structured({}) is None
    assert parse_structured({"response_format": {"type": "text"}}) is None


def test_response_format_takes_the_place_of_the_same_kind_and_keeps_its_options() -> None:
    body = {
        "structured_outputs": {"json": {"type": "string"}, "disable_any_whitespace": True},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
    }
    spec = parse_structured(body)
    assert spec == StructuredOutput(
        Constraint.JSON, spec.value if spec else "", "response_format", disable_any_whitespace=True
    )
    assert spec is not None and structured_outputs_kwargs(spec)["json"] == SCHEMA


@pytest.mark.parametrize(
    "body",
    [
        {"structured_outputs": {"json": ["not", "a", "schema"]}},
        {"structured_outputs": {"json_object": False}},
        {"structured_outputs": {"grammar": "  "}},
        {"structured_outputs": {"regex": "a", "disable_any_whitespace": "yes"}},
        {"structured_outputs": {"structural_tag": "{}"}},
        {"structured_outputs": "regex"},
        {"response_format": "json_object"},
    ],
)
def test_malformed_constraints_are_refused_naming_the_field(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_structured(body)
    assert refused.value.param == next(iter(body))
    assert next(iter(body)) in refused.value.message
