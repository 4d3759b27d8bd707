"""Cancel adapters for servers people already run: vLLM's OpenAI server and SGLang.

``vllm`` (``vllm serve``). vLLM takes the request id from the ``X-Request-Id`` header, which the
proxy sets to the call's upstream id, and prefixes it: a chat completion runs in the engine as
``chatcmpl-{id}``, a completion's prompts as ``cmpl-{id}-0``, ``cmpl-{id}-1``... A Responses call
(``POST /v1/responses``) ignores the header: its id is the body's ``request_id`` (a vLLM extra
field, ``resp_<random>`` when absent), which is also the response's ``id``, and its engine request
is ``{request_id}_0`` (``_1``, ``_2``... for the turns after a built-in tool call). vLLM's chat,
completion and Responses routes abort the engine request when the connection closes (a
background response excepted: it runs apart from the call), so closing the upstream stream is
already a cancel; that is all the adapter does by default (nothing is counted as a cancel call).
vLLM's own ``POST /v1/responses/{id}/cancel`` is no help: it answers 404 for a response that is
not background while it runs (only background ones are stored before they end) and 400 "Cannot
cancel a synchronous response" once it has ended. Where the server exposes
``POST /abort_requests`` (only with ``VLLM_SERVER_DEV_MODE=1``), ``--vllm-abort-endpoint`` also
calls it by id, with ``{"request_ids": ["chatcmpl-{id}", "cmpl-{id}-0", "resp_{id}_0"]}`` (vLLM
ignores ids it does not know, so the adapter need not know the route; later prompts and tool
turns are left to the closed stream) and the cancel token as a bearer token; for the Responses id
to be known the proxy writes ``"request_id": "resp_{id}"`` into each ``POST /v1/responses`` body
(``VllmAbort.tag_body``; a client's own is replaced, as its ``X-Request-Id`` is). vLLM answers 200
whether or not an id was running, so ``ok`` means "asked", not "was running"; a 404 means the
endpoint is missing. A background response is never aborted: the proxy makes no cancel call for
it (``proxy.cancel.responses``).

``sglang``. SGLang ignores ``X-Request-Id`` and takes the id from the body's ``rid`` field; the
proxy writes it there (``SglangAbort.tag_body``), then cancels with ``POST /abort_request``
``{"rid": ..., "abort_all": false}``. SGLang aborts every request whose rid *starts with* the
given one (so the ``_<i>`` children of ``n > 1`` go too), so the rid is the upstream id followed
by ``~``, a character ids never contain (``hangup_contract.request_id``): no live rid is then a
prefix of another. It answers 200 whether or not anything matched.
"""

from __future__ import annotations

import json
import logging

from hangup_contract.cancel_labels import Reason
from proxy.cancel import responses
from proxy.errors import CancelAttemptFailed
from proxy.labels import CancelResult

log = logging.getLogger("hangup.proxy.cancel")

VLLM_ABORT_PATH = "/abort_requests"
SGLANG_ABORT_PATH = "/abort_request"
SGLANG_RID_END = "~"  # outside the id alphabet: no rid is a prefix of another


def vllm_response_id(request_id: str) -> str:
    """The ``request_id`` (and so the response ``id``) the proxy gives a Responses call."""
    return f"resp_{request_id}"


def vllm_request_ids(request_id: str) -> list[str]:
    """The engine request ids vLLM's OpenAI server gives a call sent with ``X-Request-Id`` (chat,
    completion) or with the body's ``request_id`` written by :meth:`VllmAbort.tag_body` (the
    first turn of a Responses call)."""
    return [f"chatcmpl-{request_id}", f"cmpl-{request_id}-0", f"{vllm_response_id(request_id)}_0"]


def sglang_rid(request_id: str) -> str:
    return request_id + SGLANG_RID_END


def _common_result(server: str, status: int, text: str) -> CancelResult:
    """200 → ok; 429 and 5xx → retried; any other answer → error (retrying cannot fix it)."""
    if status == 429 or status >= 500:
        raise CancelAttemptFailed(f"{server} abort endpoint answered {status}")
    if status != 200:
        log.warning("%s refused the abort with %d: %s", server, status, text[:200])
        return CancelResult.ERROR
    return CancelResult.OK


class VllmAbort:
    """``POST {base}/abort_requests`` with the engine request ids vLLM gave the call (a
    ``CancelCall``); writes the Responses ``request_id`` into ``POST /v1/responses`` bodies
    (``TagsRequests``)."""

    name = "vllm"

    @staticmethod
    def tags(method: str, path: str) -> bool:
        return responses.reads_body(method, path)

    @staticmethod
    def tag_body(body: bytes, request_id: str) -> bytes:
        """``body`` (a JSON object) with ``request_id`` set to the call's response id."""
        return _with_field(body, "request_id", vllm_response_id(request_id))

    def request(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        body = {"request_ids": vllm_request_ids(request_id)}
        return VLLM_ABORT_PATH, json.dumps(body).encode()

    def result(self, status: int, text: str) -> CancelResult:
        if status == 404:
            log.warning(
                "vLLM has no %s (the server runs without VLLM_SERVER_DEV_MODE=1): turn "
                "--vllm-abort-endpoint off, the closed stream still aborts",
                VLLM_ABORT_PATH,
            )
            return CancelResult.ERROR
        return _common_result("vLLM", status, text)


class SglangAbort:
    """``POST {base}/abort_request`` with ``{"rid", "abort_all": false}`` (a ``CancelCall``);
    writes the rid into each JSON request body it relays (``TagsRequests``)."""

    name = "sglang"

    def request(self, request_id: str, reason: Reason) -> tuple[str, bytes]:
        body = {"rid": sglang_rid(request_id), "abort_all": False}
        return SGLANG_ABORT_PATH, json.dumps(body).encode()

    def result(self, status: int, text: str) -> CancelResult:
        return _common_result("SGLang", status, text)

    @staticmethod
    def tags(method: str, path: str) -> bool:
        return True  # every body: SGLang's generation routes all read rid

    @staticmethod
    def tag_body(body: bytes, request_id: str) -> bytes:
        """``body`` (a JSON object) with ``rid`` set to the call's rid; a client's own ``rid``
        is replaced, as a client's ``X-Request-Id`` is."""
        return _with_field(body, "rid", sglang_rid(request_id))


def _with_field(body: bytes, name: str, value: str) -> bytes:
    """``body``, a JSON object, with ``name`` set to ``value``; ``ValueError`` saying why not."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise ValueError("not a JSON object")
    payload[name] = value
    return json.dumps(payload, ensure_ascii=False).encode()
