"""KServe v2 over HTTP, with Triton's generate extension.

Health and metadata: ``/v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{m}``,
``/v2/models/{m}/ready``, ``/v2/models/{m}/config`` (the model's configuration as Triton writes
it), ``POST /v2/repository/index``. Generation: ``POST /v2/models/{m}/generate`` (one JSON answer)
and ``POST /v2/models/{m}/generate_stream`` (SSE, one event per response); ``/infer`` is answered
501 as Triton answers it for a decoupled model. Every model path also takes
``/versions/{v}`` after the model (the one version is ``1``), and any other path or method under
``/v2`` is a 404 or 405 in the same ``{"error": message}`` shape. Bodies are written as Triton
writes them: compact JSON as ``application/json``, events as ``text/event-stream;
charset=utf-8`` (``tests/triton/test_triton_parity.py`` checks the shapes against a real Triton).

The generation body takes ``text_input`` and the sampling fields (``max_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``, ``ignore_eos``) at the top level, under
``parameters``, or as a ``sampling_parameters`` JSON string, as Triton's vLLM backend does;
``exclude_input_in_output`` drops the prompt from a non-streamed answer (streamed answers never
repeat it).

A body's ``id`` is echoed in the answer (in every event of a stream) as Triton echoes it: any
string (an empty one is left out), but unlike Triton at most 128 characters
(``hangup_contract.request_id.MAX_LENGTH``), so that no client makes the gateway repeat a long
string in every event.

Streamed events carry ``triton_final_response``: false on every event but the last. When the
request sets ``parameters.triton_enable_empty_final_response``, the last data event keeps false
and an empty final event (no ``text_output``, flag true) closes the answer.

A call cancelled while it runs says what it consumed up to the cancel as KServe response
``parameters`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``): beside the
``error`` of its 499, or of a stream's last event.
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
    MethodNotAllowed,
    ModelNotFound,
    NotImplementedForModel,
    PathNotFound,
    RequestCancelled,
)
from gateway_server.http.common import (
    MODEL,
    PROTOCOL,
    REQUEST_ID_HEADER,
    SERVICE,
    client_of,
    group_of,
    read_json_object,
    request_id,
)
from gateway_server.labels import Protocol
from gateway_server.openai.fields import check_sampling
from gateway_server.requests import (
    EMPTY_FINAL_OPT_IN,
    FINAL_FLAG,
    TOKEN_BUDGET_CHAT,
    cancelled_message,
    field,
    json_object,
    sampling_params,
)
from gateway_server.service import GenerationService
from hangup_contract import request_id as request_ids

MODEL_VERSION = "1"
MODEL_PATHS = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
EVENT_STREAM = "text/event-stream; charset=utf-8"


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2", server_metadata)
    r.add_post("/v2/repository/index", repository_index)
    for model in MODEL_PATHS:
        r.add_get(model, model_metadata)
        r.add_get(f"{model}/ready", model_ready)
        r.add_get(f"{model}/config", model_config)
        r.add_post(f"{model}/generate", generate)
        r.add_post(f"{model}/generate_stream", generate_stream)
        r.add_post(f"{model}/infer", infer)


def add_unknown_paths(app: web.Application) -> None:
    """Last of all routes: anything else under ``/v2`` (what no other route of any part took)."""
    app.router.add_route("*", "/v2/{tail:.*}", unknown_path)


async def unknown_path(request: web.Request) -> web.StreamResponse:
    for resource in request.app.router.resources():
        matched, allowed = await resource.resolve(request)
        if matched is None and allowed and resource.canonical != "/v2/{tail}":
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    raise PathNotFound(f"{request.method} {request.path} is not an endpoint of this gateway")


def json_answer(
    body: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """JSON as Triton writes it: compact, ``application/json``."""
    text = _compact(body)
    return web.Response(
        body=text.encode(), status=status, headers=headers, content_type="application/json"
    )


def _service(request: web.Request) -> GenerationService:
    service: GenerationService = request.app[SERVICE]
    return service


def _model(request: web.Request) -> tuple[GenerationService, str]:
    """The service and the model the path names; ModelNotFound for another model or version."""
    service = _service(request)
    model = request.match_info["model"]
    service.check_model(model)
    version = request.match_info.get("version", MODEL_VERSION)
    if version != MODEL_VERSION:
        raise ModelNotFound(f"model {model!r} has no version {version!r}; it has version '1'")
    return service, model


async def live(request: web.Request) -> web.Response:
    """200 while this process can serve or get back to serving; 503 naming why not
    (``gateway_server.health``): Kubernetes restarts the container then."""
    problem = _service(request).liveness()
    if problem is None:
        return json_answer({"live": True})
    return json_answer({"live": False, "error": problem}, status=503)


async def ready(request: web.Request) -> web.Response:
    is_ready = _service(request).ready
    return json_answer({"ready": is_ready}, status=200 if is_ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return json_answer(
        {"name": "hangup", "version": __version__, "extensions": ["generate", "hangup_cancel"]}
    )


# The served model's inputs and outputs: the interface of Triton's vLLM backend.
INPUTS = (
    ("text_input", "BYTES", False),
    ("stream", "BOOL", True),
    ("sampling_parameters", "BYTES", True),
    ("exclude_input_in_output", "BOOL", True),
)
CONFIG_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}


async def model_metadata(request: web.Request) -> web.Response:
    service, _ = _model(request)
    return json_answer(
        {
            "name": service.model.name,
            "versions": [MODEL_VERSION],
            "platform": "hangup",
            "inputs": [{"name": n, "datatype": t, "shape": [1]} for n, t, _ in INPUTS],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
        }
    )


async def model_config(request: web.Request) -> web.Response:
    """The model's configuration in Triton's words (the part that describes this model: no
    instance groups or backend settings, which the gateway has no equivalent of)."""
    service, _ = _model(request)
    return json_answer(
        {
            "name": service.model.name,
            "platform": "",
            "backend": "hangup",
            "max_batch_size": 0,
            "input": [
                {"name": n, "data_type": CONFIG_TYPES[t], "dims": [1], "optional": o}
                for n, t, o in INPUTS
            ],
            "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
            "model_transaction_policy": {"decoupled": True},
        }
    )


async def repository_index(request: web.Request) -> web.Response:
    service = _service(request)
    state = "READY" if service.ready else "UNAVAILABLE"
    return json_answer([{"name": service.model.name, "version": MODEL_VERSION, "state": state}])


async def infer(request: web.Request) -> web.Response:
    _model(request)
    raise NotImplementedForModel(
        "HTTP end point doesn't support models with decoupled transaction policy; use generate,"
        " generate_stream or gRPC ModelStreamInfer"
    )


async def model_ready(request: web.Request) -> web.Response:
    service, _ = _model(request)
    is_ready = service.ready
    return json_answer(
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
        extra = json_object(raw, "'sampling_parameters'") if isinstance(raw, str) else raw
        if not isinstance(extra, dict):
            raise InvalidRequest("'sampling_parameters' must be a JSON object")
        check_sampling(extra, engine.features, engine.name, strict=True)
        merged.update(extra)
    check_sampling(merged, engine.features, engine.name, strict=False)
    return merged


async def _start(request: web.Request) -> tuple[GenerationService, str, dict[str, Any], str]:
    request[PROTOCOL] = Protocol.KSERVE_HTTP
    service, model = _model(request)
    request[MODEL] = model
    call_id = request_id(request)
    body = await read_json_object(request)
    return service, call_id, body, model


async def generate(request: web.Request) -> web.Response:
    service, call_id, body, model = await _start(request)
    prompt, params, options = _parse(service, body)
    echoed = _echoed_id(body)
    text = ""
    client, group = client_of(request), group_of(request)
    async with service.call(call_id, model, Protocol.KSERVE_HTTP, client, group) as call:
        try:
            async with aclosing(service.generate(call, prompt, params)) as chunks:
                async for chunk in chunks:
                    text += chunk.text
        except RequestCancelled as exc:
            raise CancelledWhileRunning(exc.reason, call.usage) from exc
    if not options.get("exclude_input_in_output", False):
        text = prompt + text
    answer = echoed | {"model_name": model, "model_version": MODEL_VERSION, "text_output": text}
    return json_answer(answer, headers={REQUEST_ID_HEADER: call_id})


async def generate_stream(request: web.Request) -> web.StreamResponse:
    service, call_id, body, model = await _start(request)
    prompt, params, options = _parse(service, body)
    empty_final = bool(options.get(EMPTY_FINAL_OPT_IN, False))
    head: dict[str, Any] = _echoed_id(body) | {"model_name": model, "model_version": MODEL_VERSION}
    client, group = client_of(request), group_of(request)
    async with service.call(call_id, model, Protocol.KSERVE_HTTP, client, group) as call:
        response = web.StreamResponse(
            headers={
                "Content-Type": EVENT_STREAM,
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
                        await response.write(sse.encode(_compact(event)))
        except RequestCancelled as exc:  # with what the call consumed up to the cancel
            end = {"error": cancelled_message(exc.reason), "parameters": call.usage.to_json()}
            await response.write(sse.encode(_compact(end)))
            await response.write_eof()
            return response
        except GatewayError as exc:
            await response.write(sse.encode(_compact({"error": str(exc)})))
            await response.write_eof()
            return response
        if empty_final:
            await response.write(sse.encode(_compact(head | {FINAL_FLAG: True})))
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


def _echoed_id(body: dict[str, Any]) -> dict[str, str]:
    """``{"id": …}`` to echo in the answer, or nothing. Raises InvalidRequest for an id that is
    not a string (Triton's words; it answers 500) or is longer than 128 characters."""
    if "id" not in body:
        return {}
    value = body["id"]
    if not isinstance(value, str):
        raise InvalidRequest(
            "Unable to parse 'id': attempt to access JSON non-string as string", param="id"
        )
    if not value:
        return {}
    if len(value) > request_ids.MAX_LENGTH:
        raise InvalidRequest(
            f"'id' is too long: at most {request_ids.MAX_LENGTH} characters", param="id"
        )
    return {"id": value}


def _compact(body: object) -> str:
    return json.dumps(body, separators=(",", ":"))
