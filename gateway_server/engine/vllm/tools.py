"""Tools (``tools``, ``tool_choice``) the way ``vllm serve`` 0.32 handles them, on vLLM's own code.

Two options, named as in ``vllm serve``: ``--tool-call-parser NAME`` picks one of vLLM's tool
parsers (``hermes``, ``llama3_json``, ...) and ``--enable-auto-tool-choice`` lets the model decide
(``"auto"``). As in ``vllm serve``, the parser is used only when both are given. Per request
(:meth:`VllmToolCalling.plan`):

1. vLLM's own request model (``ChatCompletionRequest``) validates ``tools``, ``tool_choice``,
   ``parallel_tool_calls`` and the structured-output fields: an empty ``tools``, a ``tool_choice``
   without ``tools``, a named tool that is not among them are refused in vLLM's words.
2. Without a parser, ``"auto"``, ``"required"`` and a named choice are refused as ``vllm serve``
   refuses them; ``"none"`` is answered with plain text.
3. The tools go into the chat template as ``vllm serve`` hands them over.
4. With a parser, the parser adjusts the request as in ``vllm serve``: a named or ``"required"``
   choice becomes a structured output (a structural tag in the parser's own call format, or a
   JSON schema built from the tools), which replaces the request's own.
5. Each choice gets its own parser (they keep state while streaming): :class:`VllmChoiceTools` turns
   the answer's text into ``message.tool_calls`` or streamed ``delta.tool_calls`` and picks the
   finish reason (``"tool_calls"``) by vLLM's rules.

Refusals are ``RequestRejected`` naming the field (the OpenAI layer answers them 400). The
simulated engine has no tool parsing: every request that names tools is refused by name there.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gateway_server.engine.base import EngineError, RequestRejected
from gateway_server.engine.constraint import Constraint
from gateway_server.engine.tools import ToolPlan, ToolSettings
from gateway_server.engine.vllm.inputs import from_vllm

_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "structured_outputs")
"""The request fields vLLM's request model reads to validate and adjust a request with tools."""
_PROTOCOL = "vllm.entrypoints.openai.chat_completion.protocol"


class VllmToolCalling:
    """:class:`~..tools.ToolCalling` with vLLM's parsers, built once the engine runs (the parser
    reads the model's tokenizer). Raises EngineError when the parser is unknown or cannot read
    that tokenizer."""

    def __init__(self, settings: ToolSettings, tokenizer: object, model: str = "") -> None:
        self.settings = settings
        self._tokenizer = tokenizer
        self._parser_cls: Any = None
        for module in (_PROTOCOL, "vllm.renderers.chat_utils", "vllm.exceptions"):
            import_module(module)  # now, not on the first request
        if settings.parser is not None:
            manager: Any = import_module("vllm.parser").ParserManager
            try:
                self._parser_cls = manager.get_parser(
                    tool_parser_name=settings.parser,
                    enable_auto_tools=settings.auto,
                    model_name=model,
                    tokenizer=tokenizer,
                )
            except (TypeError, KeyError, ValueError) as exc:
                raise EngineError(f"--tool-call-parser {settings.parser}: {exc}") from exc

    def plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """What to do about the request's tools; None when it names none.

        Raises RequestRejected naming the field, with ``vllm serve``'s refusals."""
        if body.get("tools") is None and body.get("tool_choice") in (None, "none"):
            return None
        request = _vllm_request(body)
        self._refuse_without_parser(request.tool_choice)
        tool_dicts = None if request.tools is None else [t.model_dump() for t in request.tools]
        if self._parser_cls is None or request.tool_choice == "none":
            return ToolPlan(tool_dicts)
        request = self.parser_for(request).adjust_request(request)
        forced = request.tool_choice == "required" or _named(request.tool_choice) is not None
        structured = from_vllm(request.extract_structured_outputs(), "tool_choice")
        if not forced and (structured is None or structured.kind is not Constraint.STRUCTURAL_TAG):
            structured = None  # the parser left the request's own constraint as it was
        skip = request.skip_special_tokens is not False  # as vLLM's parser set it
        return ToolPlan(tool_dicts, structured, _Parsers(self, request), skip)

    def _refuse_without_parser(self, choice: Any) -> None:
        if self._parser_cls is not None or choice in (None, "none"):
            return
        if choice == "auto":
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
        else:
            name = _named(choice)
            wanted = f'"{choice}"' if name is None else f'function "{name}"'
            message = f"tool_choice={wanted} requires --tool-call-parser to be set"
        raise RequestRejected(message, param="tool_choice")

    def parser_for(self, request: Any) -> Any:
        """A fresh vLLM parser for ``request`` (vLLM's request model); parsers keep state."""
        return self._parser_cls(self._tokenizer, request.tools, model_config=None)


class _Parsers:
    """A parser per choice, for one request as vLLM's parser adjusted it."""

    def __init__(self, calling: VllmToolCalling, request: Any) -> None:
        self._calling = calling
        self._request = request

    def choice(self) -> VllmChoiceTools:
        parser = self._calling.parser_for(self._request)
        return VllmChoiceTools(parser, self._request, self._calling.settings)


class VllmChoiceTools:
    """Tool calls in one choice's answer: vLLM's parser, then ``vllm serve``'s rules for the
    message, the stream deltas and the finish reason."""

    def __init__(self, parser: Any, request: Any, settings: ToolSettings) -> None:
        self._parser = parser
        self._request = request
        self._auto = settings.auto
        self._named = _named(request.tool_choice) is not None
        self._required = request.tool_choice == "required"
        self._single = request.parallel_tool_calls is False
        self._streamed_calls = False

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The whole answer's ``message`` and its finish reason."""
        _, content, calls = self._parser.parse(text, self._request, enable_auto_tools=self._auto)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        tool_calls: list[dict[str, Any]] = []
        if self._named or self._required:
            message["content"] = content or ""
            tool_calls = [_tool_call(call) for call in calls or []]
        elif self._request.tool_choice in ("auto", None):
            tool_calls = [_tool_call(call) for call in calls or []]
        if self._single:
            tool_calls = tool_calls[:1]
        if tool_calls:
            message["tool_calls"] = tool_calls
        called = bool(tool_calls) and not (self._named or self._required)
        if called or (self._required and finish == "stop"):
            finish = "tool_calls"
        return message, finish

    def delta(self, text: str, finish: str | None) -> dict[str, Any] | None:
        """The ``delta`` for the next piece of the answer; None: nothing to send yet. (The
        prompt's token ids only tell a reasoning parser where reasoning ends: none is used.)"""
        delta = self._parser.parse_delta(
            delta_text=text,
            delta_token_ids=[],
            request=self._request,
            prompt_token_ids=[],
            finished=finish is not None,
        )
        if delta is None:
            return None if finish is None else {}
        out: dict[str, Any] = delta.model_dump(exclude_unset=True)
        calls = out.get("tool_calls")
        if calls:
            self._streamed_calls = True
            if self._single:
                out["tool_calls"] = [call for call in calls if call.get("index") == 0]
        return out

    def stream_finish(self, finish: str) -> str:
        """The finish reason of a streamed choice (after its deltas went out)."""
        if self._streamed_calls and not self._named and finish == "stop":
            return "tool_calls"
        return finish


def _vllm_request(body: dict[str, Any]) -> Any:
    """vLLM's request model on the tool and structured-output fields (the messages are the
    gateway's to check): vLLM's own validators run."""
    protocol: Any = import_module(_PROTOCOL)
    client_fault: Any = import_module("vllm.exceptions").VLLMClientError
    fields = {name: body[name] for name in _FIELDS if name in body}
    try:
        return protocol.ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": ""}], **fields}
        )
    except (ValueError, client_fault) as exc:  # pydantic's ValidationError is a ValueError
        message, param = _reason(exc)
        raise RequestRejected(message, param=param) from exc


def _reason(exc: Exception) -> tuple[str, str]:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc), str(getattr(exc, "parameter", None) or "tools")
    first = errors()[0]
    inner = first.get("ctx", {}).get("error")
    if isinstance(inner, Exception):
        return str(inner), str(getattr(inner, "parameter", None) or "tools")
    where = ".".join(str(part) for part in first.get("loc", ()))
    return f"'{where}': {first.get('msg')}", where.split(".")[0] or "tools"


def _named(choice: Any) -> str | None:
    function = getattr(choice, "function", None)
    return None if function is None else str(function.name)


def _tool_call(call: Any) -> dict[str, Any]:
    protocol: Any = import_module(_PROTOCOL)
    chat_utils: Any = import_module("vllm.renderers.chat_utils")
    tool_call = protocol.ToolCall(id=call.id or chat_utils.make_tool_call_id(), function=call)
    result: dict[str, Any] = tool_call.model_dump()
    return result
