"""Structured output: ``response_format`` (OpenAI's) and ``structured_outputs`` (vLLM's own).

:func:`parse_structured` reads both fields of a request body into one engine-neutral
:class:`StructuredOutput` (or None), refusing with :class:`InvalidRequest` what ``vllm serve``
0.32 refuses before it runs a request: an unknown ``response_format`` type, ``json_schema``
without its ``json_schema`` object, several constraints at once, a constraint next to a named
``tool_choice``. What only the engine can judge (a JSON schema or a grammar its backend cannot
compile) the engine refuses: see ``Engine.check``.

As in vLLM, ``response_format`` (when not ``text``) takes the place of the constraint in
``structured_outputs`` and keeps its options (``disable_any_whitespace`` and the like).
No I/O; the vLLM engine maps the spec onto vLLM's ``StructuredOutputsParams``
(``gateway_server.engine.vllm.inputs``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gateway_server.engine.constraint import STRUCTURED_OUTPUTS, Constraint, StructuredOutput
from gateway_server.errors import InvalidRequest
from gateway_server.requests import json_value

RESPONSE_FORMAT = "response_format"


_OPTIONS = {
    "disable_any_whitespace": bool,
    "disable_additional_properties": bool,
    "whitespace_pattern": str,
}
_CLIENT_CONSTRAINTS = (
    Constraint.JSON,
    Constraint.JSON_OBJECT,
    Constraint.REGEX,
    Constraint.CHOICE,
    Constraint.GRAMMAR,
)
_EXCLUSIVE = (Constraint.JSON, Constraint.REGEX, Constraint.CHOICE)
"""The constraints vLLM refuses beside a named ``tool_choice``."""


def parse_structured(body: dict[str, Any]) -> StructuredOutput | None:
    """The request's output constraint, or None. Raises InvalidRequest naming the field."""
    spec = _structured_outputs(body.get(STRUCTURED_OUTPUTS))
    fmt = _response_format(body.get(RESPONSE_FORMAT))
    if spec is not None and spec.kind in _EXCLUSIVE and _names_a_tool(body.get("tool_choice")):
        raise InvalidRequest(
            "You can only either use constraints for structured outputs or tools, not both.",
            param=STRUCTURED_OUTPUTS,
        )
    if fmt is None:
        return spec
    if spec is None:
        return fmt
    if spec.kind is not fmt.kind:
        # vLLM lays response_format over structured_outputs: two kinds of constraint remain.
        raise InvalidRequest(
            f"'{RESPONSE_FORMAT}' and '{STRUCTURED_OUTPUTS}' ask for two kinds of structured "
            f"output ({fmt.kind} and {spec.kind}); use one",
            param=RESPONSE_FORMAT,
        )
    return replace(spec, value=fmt.value, source=RESPONSE_FORMAT)


def _names_a_tool(tool_choice: object) -> bool:
    return tool_choice is not None and tool_choice not in ("none", "auto", "required")


def _response_format(raw: object) -> StructuredOutput | None:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(Constraint.JSON_OBJECT, True, RESPONSE_FORMAT)
    if kind != "json_schema":
        raise InvalidRequest(
            f"'{RESPONSE_FORMAT}' must be an object with a type of 'text', 'json_object' or "
            "'json_schema'",
            param=RESPONSE_FORMAT,
        )
    assert isinstance(raw, dict)
    schema_spec = raw.get("json_schema")
    if schema_spec is None:
        raise InvalidRequest(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            param=RESPONSE_FORMAT,
        )
    if not isinstance(schema_spec, dict) or not isinstance(schema_spec.get("name"), str):
        raise InvalidRequest(
            "'response_format.json_schema' must be an object with a 'name' string",
            param=RESPONSE_FORMAT,
        )
    schema = schema_spec.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(
            "'response_format.json_schema.schema' must be a JSON schema object",
            param=RESPONSE_FORMAT,
        )
    return StructuredOutput(Constraint.JSON, json.dumps(schema), RESPONSE_FORMAT)


def _structured_outputs(raw: object) -> StructuredOutput | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'{STRUCTURED_OUTPUTS}' must be an object", param=STRUCTURED_OUTPUTS)
    given = [kind for kind in _CLIENT_CONSTRAINTS if raw.get(kind.value) is not None]
    if raw.get(Constraint.STRUCTURAL_TAG.value) is not None:
        raise InvalidRequest(
            f"'{STRUCTURED_OUTPUTS}.structural_tag' is not supported by the gateway",
            param=STRUCTURED_OUTPUTS,
        )
    if len([kind for kind in given if kind in _EXCLUSIVE]) > 1:
        raise InvalidRequest(  # vLLM's words
            "You can only use one kind of constraints for structured outputs ('json', 'regex' "
            "or 'choice').",
            param=STRUCTURED_OUTPUTS,
        )
    if len(given) != 1:
        several = "only one kind" if given else "one kind"
        raise InvalidRequest(
            f"'{STRUCTURED_OUTPUTS}' must set {several} of constraint: 'json', 'json_object', "
            "'regex', 'choice' or 'grammar'",
            param=STRUCTURED_OUTPUTS,
        )
    kind = given[0]
    options = {name: raw[name] for name in _OPTIONS if raw.get(name) is not None}
    for name, value in options.items():
        if not isinstance(value, _OPTIONS[name]):
            raise InvalidRequest(
                f"'{STRUCTURED_OUTPUTS}.{name}' must be a {_OPTIONS[name].__name__}",
                param=STRUCTURED_OUTPUTS,
            )
    return StructuredOutput(kind, _constraint_value(kind, raw[kind.value]), **options)


def _constraint_value(kind: Constraint, value: object) -> str | tuple[str, ...] | bool:
    where = f"'{STRUCTURED_OUTPUTS}.{kind}'"
    if kind is Constraint.JSON:
        if isinstance(value, str):
            value = json_value(value, where, param=STRUCTURED_OUTPUTS)
        if not isinstance(value, dict):
            raise InvalidRequest(f"{where} must be a JSON schema object", param=STRUCTURED_OUTPUTS)
        return json.dumps(value)
    if kind is Constraint.JSON_OBJECT:
        if value is not True:
            raise InvalidRequest(f"{where} must be true if set", param=STRUCTURED_OUTPUTS)
        return True
    if kind is Constraint.CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidRequest(
                f"{where} must be a non-empty array of strings", param=STRUCTURED_OUTPUTS
            )
        return tuple(value)
    if not isinstance(value, str) or (kind is Constraint.GRAMMAR and not value.strip()):
        raise InvalidRequest(f"{where} must be a non-empty string", param=STRUCTURED_OUTPUTS)
    return value
