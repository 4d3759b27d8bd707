"""Cancel adapters for servers people already run: vLLM's OpenAI server and SGLang.

``vllm`` (``vllm serve``). vLLM takes the request id from the ``X-Request-Id`` header, which the
proxy sets to the call's upstream id, and prefixes it: a chat completion runs in the engine as
``chatcmpl-{id}``, a completion's prompts as ``cmpl-{id}-0``, ``cmpl-{id}-1``... Its chat and
completion routes abort the engine request when the connection closes, so closing the upstream
stream is already a cancel; that is all the adapter does by default (nothing is counted as a
cancel call). Where the server exposes ``POST /abort_requests`` (only with
``VLLM_SERVER_DEV_MODE=1``), ``--vllm-abort-endpoint`` also calls it by id, with
``{"request_ids": ["chatcmpl-{id}", "cmpl-{id}-0"]}`` (vLLM ignores ids it does not know, so the
adapter need not know the route; the later prompts of a multi-prompt completion are left to the
closed stream) and the cancel token as a bearer token. vLLM answers 200 whether or not an id was
running, so ``ok`` means "asked", not "was running"; a 404 means the endpoint is missing.

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

from hangup_contract.vocabulary import Reason
from proxy.errors import CancelAttemptFailed
from proxy.vocabulary import CancelResult

log = logging.getLogger("hangup.proxy.cancel")

VLLM_ABORT_PATH = "/abort_requests"
SGLANG_ABORT_PATH = "/abort_request"
SGLANG_RID_END = "~"  # outside the id alphabet: no rid is a prefix of another


def vllm_request_ids(request_id: str) -> list[str]:
    """The engine request ids vLLM's OpenAI server gives a call sent with ``X-Request-Id``."""
    return [f"chatcmpl-{request_id}", f"cmpl-{request_id}-0"]


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
    ``CancelCall``)."""

    name = "vllm"

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
    def tag_body(body: bytes, request_id: str) -> bytes:
        """``body`` (a JSON object) with ``rid`` set to the call's rid; a client's own ``rid``
        is replaced, as a client's ``X-Request-Id`` is."""
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
        payload["rid"] = sglang_rid(request_id)
        return json.dumps(payload, ensure_ascii=False).encode()
