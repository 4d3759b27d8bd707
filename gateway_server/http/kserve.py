"""KServe v2 over HTTP, with Triton's generate extension.

Health and metadata: ``/v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{m}``,
``/v2/models/{m}/ready``. Generation: ``POST /v2/models/{m}/generate`` (one JSON answer) and
``POST /v2/models/{m}/generate_stream`` (SSE, one event per response). The body takes
``text_input`` and the sampling fields (``max_tokens``, ``temperature``, ``top_p``, ``seed``,
``stop``, ``ignore_eos``) at the top level, under ``parameters``, or as a ``sampling_parameters``
JSON string, as Triton's vLLM backend does; ``exclude_input_in_output`` drops the prompt from a
non-streamed answer (streamed answers never repeat it).

Streamed events carry ``triton_final_response``: false on every event but the last. When the
request sets ``parameters.triton_enable_empty_final_response``, the last data event keeps false
and an empty final event (no ``text_output``, flag true) closes the answer.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

from aiohttp import web

from gateway_server import __version__, sse
from gateway_server.errors import (
    CancelledWhileRunning,
    GatewayError,
    InvalidRequest,
    RequestCancelled,
)
from gateway_server.http.common import (
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
    read_json_object,
    request_id,
)
from gateway_server.openai.fields import check_sampling
from gateway_server.requests import (
    EMPTY_FINAL_OPT_IN,
    FINAL_FLAG,
    TOKEN_BUDGET_CHAT,
    cancelled_message,
    field,
    sampling_params,
)
from gateway_server.service import GenerationService
from gateway_server.vocabulary import Protocol

MODEL_VERSION = "1"


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/models/{model}", model_metadata)
    r.add_get("/v2/models/{model}/ready", model_ready)
    r.add_post("/v2/models/{model}/generate", generate)
    r.add_post("/v2/models/{model}/generate_stream", generate_stream)


def _service(request: web.Request) -> GenerationService:
    service: GenerationService = request.app[SERVICE]
    return service


async def live(request: web.Request) -> web.Response:
    """200 while this process can serve or get back to serving; 503 naming why not
    (``gateway_server.health``): Kubernetes restarts the container then."""
    problem = _service(request).liveness()
    if problem is None:
        return web.json_response({"live": True})
    return web.json_response({"live": False, "error": problem}, status=503)


async def ready(request: web.Request) -> web.Response:
    is_ready = _service(request).ready
    return web.json_response({"ready": is_ready}, status=200 if is_ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(
        {"name": "hangup", "version": __version__, "extensions": ["generate", "hangup_cancel"]}
    )


async def model_metadata(request: web.Request) -> web.Response:
    service = _service(request)
    service.check_model(request.match_info["model"])
    return web.json_response(
        {
            "name": service.model.name,
            "versions": [MODEL_VERSION],
            "platform": "hangup",
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1]},
                {"name": "stream", "datatype": "BOOL", "shape": [1]},
                {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1]},
                {"name": "exclude_input_in_output", "datatype": "BOOL", "shape": [1]},
            ],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
        }
    )


async def model_ready(request: web.Request) -> web.Response:
    service = _service(request)
    service.check_model(request.match_info["model"])
    is_ready = service.ready
    return web.json_response(
        {"name": service.model.name, "ready": is_ready}, status=200 if is_ready else 503
    )


def _sampling_body(body: dict[str, Any], service: GenerationService) -> dict[str, Any]:
    """The request's options: its top-level keys, then its ``parameters``, then the fields of its
    ``sampling_parameters`` (JSON, or a JSON text), each later one winning. A field of
    ``sampling_parameters`` that is no sampling parameter is refused by name, as is one the
    engine does not honour, wherever it is given."""
    engine = service.engine
    merged = {k: v for k, v in body.items() if k not in ("parameters", "sampling_parameters")}
    parameters = field(body, "parameters", dict, {})
    merged.update(parameters)
    raw = body.get("sampling_parameters", parameters.get("sampling_parameters"))
    if raw is not None:
        try:
            extra = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"'sampling_parameters' is not valid JSON: {exc}") from exc
        if not isinstance(extra, dict):
            raise InvalidRequest("'sampling_parameters' must be a JSON object")
        check_sampling(extra, engine.features, engine.name, strict=True)
        merged.update(extra)
    check_sampling(merged, engine.features, engine.name, strict=False)
    return merged


async def _start(request: web.Request) -> tuple[GenerationService, str, dict[str, Any], str]:
    service = _service(request)
    request[PROTOCOL] = Protocol.KSERVE_HTTP
    model = request.match_info["model"]
    service.check_model(model)
    request[MODEL] = model
    call_id = request_id(request)
    body = await read_json_object(request)
    return service, call_id, body, model


async def generate(request: web.Request) -> web.Response:
    service, call_id, body, model = await _start(request)
    prompt, params, options = _parse(service, body)
    text = ""
    async with service.call(call_id, model, Protocol.KSERVE_HTTP) as call:
        try:
            async with aclosing(service.generate(call, prompt, params)) as chunks:
                async for chunk in chunks:
                    text += chunk.text
        except RequestCancelled as exc:
            raise CancelledWhileRunning(exc.reason) from exc
    if not options.get("exclude_input_in_output", False):
        text = prompt + text
    answer = {"model_name": model, "model_version": MODEL_VERSION, "text_output": text}
    if "id" in body:
        answer["id"] = str(body["id"])
    return web.json_response(answer, headers={REQUEST_ID_HEADER: call_id})


async def generate_stream(request: web.Request) -> web.StreamResponse:
    service, call_id, body, model = await _start(request)
    prompt, params, options = _parse(service, body)
    empty_final = bool(options.get(EMPTY_FINAL_OPT_IN, False))
    head: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if "id" in body:
        head["id"] = str(body["id"])
    async with service.call(call_id, model, Protocol.KSERVE_HTTP) as call:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                REQUEST_ID_HEADER: call_id,
            }
        )
        await response.prepare(request)
        try:
            async with aclosing(service.generate(call, prompt, params)) as chunks:
                async for chunk in chunks:
                    final = chunk.finish_reason is not None and not empty_final
                    if chunk.text or final:
                        event = head | {"text_output": chunk.text, FINAL_FLAG: final}
                        await response.write(sse.encode(json.dumps(event)))
        except (RequestCancelled, GatewayError) as exc:
            message = (
                cancelled_message(exc.reason) if isinstance(exc, RequestCancelled) else str(exc)
            )
            await response.write(sse.encode(json.dumps({"error": message})))
            await response.write_eof()
            return response
        if empty_final:
            await response.write(sse.encode(json.dumps(head | {FINAL_FLAG: True})))
        await response.write_eof()
        return response


def _parse(service: GenerationService, body: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    prompt = field(body, "text_input", str, None)
    if prompt is None:
        raise InvalidRequest("'text_input' is required and must be a string", param="text_input")
    options = _sampling_body(body, service)
    params = sampling_params(
        options,
        service.engine,
        max_model_len=service.model.max_model_len,
        default_max_tokens=16,
        budget=TOKEN_BUDGET_CHAT,
    )
    service.check_prompt(prompt, params)
    field(options, "exclude_input_in_output", bool, False)
    field(options, EMPTY_FINAL_OPT_IN, bool, False)
    return prompt, params, options
