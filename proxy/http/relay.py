"""The HTTP/1.1 listener: relays any method and path upstream, and cancels calls whose client left.

The server (``proxy.http.protocol``) parses requests and runs the handler for each in a task of
its own; the moment the client's connection is lost (FIN or RST, read by the transport whatever
the handler is doing) that task is cancelled. That is how a hang-up is seen in every stage
without waiting for the next write: while the request body is still arriving, while waiting for
the upstream's first byte, and while streaming. A client that
only shuts down its write side looks the same to the transport and is treated as a hang-up (see
docs/proxy.md, "Half-closed connections").

With ``--cancel-adapter triton`` an ``infer``, ``generate`` or ``generate_stream`` call is
answered by the Triton bridge over gRPC instead (``proxy.triton``), under the same call
accounting and hang-up handling: its gRPC call is the upstream call that a hang-up closes.

Per call: admit (limits) → choose ids → stream the body up (read whole first where the proxy
must see it: a body the adapter tags, a ``POST /v1/responses`` that may ask for a background
response, ``proxy.cancel.responses``) → relay the response chunk by chunk as it arrives (no batching
of SSE events) → release. The upstream side is ``proxy.upstream.client``:
each chunk the upstream sends is written to the client's transport in the callback that parsed
it (``proxy.http.exchange.ClientSink``), so no task runs per event; the handler waits for the
body's end.
How the call ends (the reason, the explicit cancel by request id, closing the upstream once
the cancel is answered or ``--stream-close-grace`` passed, the one log line) is
``proxy.calls.lifecycle``'s, shared with gRPC; this module says when: the upstream call is an object
of its own (``Client.start``) so that it outlives the handler's cancellation, and a hang-up while
it is open is seen in the server's ``connection_lost`` callback itself, a turn of the event loop
before the handler's cancellation arrives (``proxy.http.protocol``). Errors the proxy makes
itself are ``ProxyError`` responses (JSON, OpenAI-style ``{"error": {...}}``) while nothing has
been sent yet; after that the only honest signal is to close the client connection without the
final chunk, so a truncated response never looks complete.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from hangup_contract.cancel import cancelled_id
from hangup_contract.cancel_labels import Reason
from hangup_contract.jobs import Route, route_of
from hangup_contract.runtime.connections import BodyStalled
from proxy.calls.admin_paths import Refusal
from proxy.calls.groups import checked_group
from proxy.calls.lifecycle import CallEnding, log_call
from proxy.calls.request_ids import REQUEST_ID, request_ids_for
from proxy.calls.state import Call, ServerState
from proxy.cancel import responses
from proxy.cancel.choice import body_tagger
from proxy.cancel.http import HttpCancelAdapter
from proxy.cancel.protocols import CancelTask
from proxy.config import AdapterName
from proxy.errors import (
    BadBody,
    BodyTimeout,
    BodyTooLarge,
    CancelledById,
    ClientGone,
    ExpectationFailed,
    Overloaded,
    ProxyError,
    ProxyTimeout,
    UpstreamBroken,
    UpstreamError,
    UpstreamUnavailable,
)
from proxy.http.answer_ids import FirstBytes
from proxy.http.cancel_api import CancelById
from proxy.http.exchange import ClientSink, Exchange, held_upstream
from proxy.http.headers import add_ids, client_response_head, upstream_request_headers
from proxy.http.scrape import scrape
from proxy.http.tagging import TAG_LIMIT, tag_body
from proxy.labels import SERVER_HEADER, CallProtocol, Outcome, Stage
from proxy.messages import Answer, ClientConnection, Request, Stream, error_answer
from proxy.triton.bridge import TritonBridge, Upstream
from proxy.upstream.client import Client
from proxy.upstream.connection import Response
from proxy.upstream.framing import Body

log = logging.getLogger("hangup.proxy.http")


def _as_is(body: bytes, request_id: str) -> bytes:
    return body


def _cancel_route(method: str, target: str) -> Route | None:
    """The cancel API's route ``target`` names (``hangup_contract``), or None."""
    if method == "POST":
        request_id = cancelled_id(target)
        if request_id is not None:
            return Route("single", request_id=request_id)
    return route_of(method, target)


class HttpRelay:
    """The request handler: one instance per listener, shared by every connection."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._config = state.config
        self._base = state.config.upstream_http.rstrip("/")
        self._tagger = body_tagger(state.canceller.adapters[CallProtocol.HTTP])
        self._upstream = Client(self._base, connect_timeout=self._config.upstream_connect_timeout)
        triton = self._config.cancel_adapter is AdapterName.TRITON
        self._bridge = TritonBridge(self._config.upstream_grpc) if triton else None
        # Calls whose upstream call is open, by their client connection.
        self._relaying: dict[ClientConnection, Exchange] = {}
        self._submit = state.canceller.submitter(CallProtocol.HTTP)  # the same for every call
        self._guard = state.config.admin_guard()
        adapter = state.canceller.adapters[CallProtocol.HTTP]
        self._cancels_upstream = adapter.calls_upstream and self._bridge is None
        config = self._config
        self._cancels: CancelById | None = None  # the proxy's own cancel by id, with a token
        if state.held is not None and config.cancel_token is not None:
            # With hangup's gateway behind, what is not held is asked of it (the proxy's own call)
            post = adapter.forward if isinstance(adapter, HttpCancelAdapter) else None
            hangup = config.cancel_adapter is AdapterName.HANGUP and not config.cancel_pool
            self._cancels = CancelById(
                state.held, config.cancel_token, post=post if hangup else None,
                body_timeout=config.body_timeout, metrics=state.metrics,
                max_batch_ids=config.max_batch_ids, siblings=state.siblings,
                listing=state.listing,
            )  # fmt: skip

    async def close(self) -> None:
        await self._upstream.close()
        if self._bridge is not None:
            await self._bridge.close()

    async def __call__(self, request: Request) -> Answer | Stream | None:
        if request.method == "GET" and request.path in self._config.scrape_paths:
            return await scrape(request, self._upstream, self._state.metrics)
        if self._cancels is not None:  # the proxy's own cancel API: answered here, never relayed
            route = _cancel_route(request.method, request.raw_path)
            if route is not None:
                return await self._cancels.route(request, route)
        refused = self._guard.http(request.raw_path)
        if refused is not None:
            return self._refused(request, refused)
        call = Call(CallProtocol.HTTP, request.method, request.path_qs, request.remote)
        ending = CallEnding(
            call,
            self._state.metrics,
            self._submit,
            close_grace=self._config.stream_close_grace,
            gone_status=499,
            log=log_call,
        )
        ex = Exchange(request, call, ending)
        call.task = request.task
        try:
            self._state.admit(call)
        except Overloaded as exc:
            response = self._error(ex, exc)
            ending.finish()
            return response
        # Every way a call can end, mapped to its reason (``proxy.calls.lifecycle`` does the rest:
        # the cancel, the upstream's close, the count and the log line). Here, not in a coroutine
        # of its own: each frame between the task and the upstream's head is resumed per call.
        limit = self._config.max_request_duration
        deadline = asyncio.timeout(limit) if limit is not None else None  # only if one is set
        try:
            if deadline is None:
                response = await self._relay(ex)
            else:
                async with deadline:
                    response = await self._relay(ex)
            call.outcome = call.outcome or Outcome.COMPLETED  # cancelled by id: stays so
            return response
        except ClientGone:  # writing failed: the cancellation of the handler follows
            ending.stop(Reason.CLIENT_DISCONNECT)
            return self._prepared(ex)
        except ProxyError as exc:
            return self._error(ex, exc)
        except TimeoutError:
            if deadline is None or not deadline.expired():
                raise
            ending.stop(Reason.PROXY_TIMEOUT)
            return self._error(ex, ProxyTimeout("the call ran past --max-request-duration"))
        except asyncio.CancelledError:
            ending.stop(call.reason or Reason.CLIENT_DISCONNECT)
            raise
        finally:
            self._relaying.pop(request.connection, None)
            ending.close_upstream(ex.close_upstream)
            if call.outcome is Outcome.CANCELLED and ex.sink is not None:
                call.usage = ex.sink.usage()  # once, at the end (proxy.http.relayed)
            ending.finish()
            self._state.release(call)

    def _watch(self, call: Call) -> Callable[[bytes], bool] | None:
        """With the cancel API on, what reads the answer's own id from its first bytes, once,
        and holds the call under it too (``proxy.http.answer_ids``); else None."""
        held = self._state.held
        if self._cancels is None or held is None or call.holding is None:
            return None
        first, holding = FirstBytes(), call.holding

        def watch(chunk: bytes) -> bool:
            if not first.feed(chunk):
                return False
            if first.answer_id is not None and call.holding is holding:
                call.answer_id, call.model, call.streaming = (
                    first.answer_id,
                    first.model,
                    first.streaming,
                )
                held.name(holding, first.answer_id)
            return True

        return watch

    def _refused(self, request: Request, refusal: Refusal) -> Answer:
        """403 for an admin route of the server behind (``proxy.calls.admin_paths``), naming its
        rule, in the shape the server answers errors (Triton's ``{"error": message}`` with the
        bridge); outside the call accounting, as a scrape is: counted, and logged once."""
        message = refusal.message(request.raw_path)
        self._state.metrics.admin_refused(CallProtocol.HTTP, refusal.rule.name)
        log.warning(
            "refused an admin route: %s",
            refusal.rule.name,
            extra={"fields": {"path": request.raw_path[:200], "remote": request.remote}},
        )
        if self._bridge is None:
            return error_answer(403, message, "permission_denied")
        body = json.dumps({"error": message}).encode()
        return Answer(403, body, content_type="application/json", headers={"Server": SERVER_HEADER})

    def _end_by_id(self, ex: Exchange, reason: Reason) -> CancelTask | None:
        """End a call cancelled by id (``proxy.http.cancel_api``) the way its adapter ends a
        hang-up, its client kept: the adapter's cancel call, after which the upstream ends the
        call and its end is relayed (a gateway answers 499, or ends the stream with an error
        event); with no cancel call (``none``, ``vllm`` without its abort endpoint, the Triton
        bridge's gRPC call), the upstream call closed, and the client gets 499, or its stream
        cut. Before the upstream call is sent, nothing is: the relay refuses it (499)."""
        ending = ex.ending
        if ending.stopped:
            return ending.cancel
        cancel = ending.stop(reason)
        if not ending.upstream_open:
            return cancel
        if not self._cancels_upstream or ex.bridged is not None or cancel is None:
            ex.abort_upstream()
        else:  # the upstream ends it; if its cancel fails, the proxy does
            cancel.add_done_callback(
                lambda task: None if held_upstream(task) else ex.abort_upstream()
            )
        return cancel

    def connection_lost(self, connection: ClientConnection) -> None:
        """The client ``connection`` is gone: cancel its call upstream at once.

        Called by the server's transport callback, before it cancels the handler task. Submitting
        the cancel here rather than when that cancellation reaches the handler saves a turn of
        the event loop, queued behind every relay callback that is ready (a whole engine step's
        token fan-out at high concurrency). The handler then finds the cancel submitted.
        """
        ex = self._relaying.pop(connection, None)
        if ex is not None:
            ex.ending.stop(ex.call.reason or Reason.CLIENT_DISCONNECT)

    async def _relay(self, ex: Exchange) -> Answer | Stream:
        request, call = ex.request, ex.call
        head = upstream_request_headers(
            request.headers, client_addr=request.remote, scheme=request.scheme
        )
        ids = request_ids_for(head.request_id, trust_client=self._config.trust_client_request_id)
        call.request_id, call.client_request_id = ids.upstream, ids.client
        state = self._state
        if head.group is not None and state.held is not None:
            call.group = checked_group(head.group)
        if state.held is not None and state.hold(call, lambda why: self._end_by_id(ex, why)):
            await state.hold_everywhere(call)  # --workers: a trusted id, free in every worker?
        limit = self._config.max_body_size
        if (
            limit is not None
            and request.content_length is not None
            and request.content_length > limit
        ):
            raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds {limit}")
        headers = head.upstream
        add_ids(headers, ids)
        self._continue(request, head.expect)
        if self._bridge is not None and self._bridge.takes(request):
            if ex.ending.stopped:
                raise CancelledById("request cancelled (explicit)")
            return await self._bridged(ex, self._bridge)
        call.detached = responses.names_a_response(request.path)
        body: Body = None
        if request.body_exists:
            tags = self._tagger is not None and self._tagger.tags(request.method, request.path)
            if tags or responses.reads_body(request.method, request.path):
                body, headers = await self._read_body(ex, headers, ids.upstream, tags=tags)
            elif (body := self._arrived(ex)) is None:
                body = self._body(ex)  # streamed up as it arrives
        if ex.ending.stopped:  # cancelled by id while its body was read: nothing goes up
            raise CancelledById("request cancelled (explicit)")
        sent = time.monotonic()
        # The upstream call is an object of its own (written now on an idle connection), so a
        # hang-up that cancels this handler leaves it open until the explicit cancel has been
        # answered (CallEnding.close_upstream).
        ex.ending.upstream_open = True
        ex.upstream_call = self._upstream.start(request.method, request.raw_path, headers, body)
        self._relaying[request.connection] = ex
        try:
            upstream = await ex.upstream_call.head  # the call goes on if this handler is cancelled
        except UpstreamUnavailable:
            ex.ending.upstream_open = False  # never reached: nothing to cancel
            raise
        except UpstreamBroken as exc:
            if ex.body_error is not None:  # the client's body failed: its own error says why
                raise ex.body_error from exc
            raise
        try:
            call.upstream_ttfb = time.monotonic() - sent
            self._state.metrics.first_byte(call.upstream_ttfb)
            response = self._respond(ex, upstream)
            if request.method != "HEAD" and upstream.status >= 200:  # a body: relayed as it comes
                watch = self._watch(call) if upstream.status == 200 else None
                ex.sink = ClientSink(request, response, call, watch)
                await upstream.stream_to(ex.sink)
        except (asyncio.CancelledError, TimeoutError, ClientGone):
            raise  # a cancel follows: the upstream is closed once it is answered
        except BaseException:
            upstream.close()  # drop the connection: the upstream sees its stream end at once
            raise
        upstream.release()
        return response

    async def _bridged(self, ex: Exchange, bridge: TritonBridge) -> Answer | Stream:
        """Triton's infer or generate over gRPC (``proxy.triton``): the body read whole, then the
        call cancelled like any upstream call when the client leaves."""
        body = self._arrived(ex) if ex.request.body_exists else b""
        if body is None:
            assert ex.call.request_id is not None
            whole, _ = await self._whole(self._body(ex), [], ex.call.request_id, tag=False)
            if not isinstance(whole, bytes):
                raise BodyTooLarge(f"a bridged body is read whole: at most {TAG_LIMIT} bytes")
            body = whole
        upstream = ex.bridged = Upstream()

        def opened() -> None:
            ex.ending.upstream_open = True
            self._relaying[ex.request.connection] = ex

        assert ex.call.request_id is not None
        headers = {REQUEST_ID: ex.call.request_id, "Server": SERVER_HEADER}
        return await bridge.relay(ex.request, ex.call, body, upstream, opened, headers)

    @staticmethod
    def _continue(request: Request, expect: str | None) -> None:
        """Answer ``Expect: 100-continue`` once the limits have passed (the body is wanted)."""
        if expect is None or request.version < (1, 1):
            return
        if expect.lower() != "100-continue":
            raise ExpectationFailed(f"unsupported Expect: {expect}")
        request.connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _read_body(
        self, ex: Exchange, headers: list[tuple[str, str]], request_id: str, *, tags: bool
    ) -> tuple[Body, list[tuple[str, str]]]:
        """The body to send up, and the headers to send it with, where the proxy must see it:
        read whole (the adapter's upstream reads the call's id in it, ``TagsRequests``; or it
        may ask for a background response, ``proxy.cancel.responses``)."""
        request = ex.request
        reads = responses.reads_body(request.method, request.path)
        body: Body = None if tags else self._arrived(ex)
        if body is None:
            body, headers = await self._whole(self._body(ex), headers, request_id, tag=tags)
        if reads and isinstance(body, bytes):
            ex.call.detached = responses.asks_for_background(body)
        elif reads:
            log.warning(
                "Responses body over the proxy's read limit: relayed as a call whose hang-up is "
                "cancelled, whether or not it asks for a background response",
                extra={"fields": {"request_id": request_id}},
            )
        return body, headers

    async def _whole(
        self,
        body: AsyncIterator[bytes],
        headers: list[tuple[str, str]],
        request_id: str,
        *,
        tag: bool,
    ) -> tuple[bytes | AsyncIterator[bytes], list[tuple[str, str]]]:
        """The body read whole (up to the limit), with the call's id written in when ``tag``."""
        limit = self._config.max_body_size or TAG_LIMIT
        write = self._tagger.tag_body if tag and self._tagger is not None else _as_is
        sent, untagged = await tag_body(body, write, request_id, limit)
        if untagged is not None and tag:
            log.warning(
                "request body not tagged with the call's id: %s",
                untagged,
                extra={"fields": {"request_id": request_id}},
            )
        if isinstance(sent, bytes):  # a new length, sent as Content-Length
            headers = [(n, v) for n, v in headers if n.lower() != "content-length"]
        return sent, headers

    def _arrived(self, ex: Exchange) -> bytes | None:
        """The whole body if it has all arrived already (a small request usually comes in one
        packet with its head), else None: then it is streamed up as it arrives. Sent as bytes,
        it goes out with the head in one write, and can be sent again if a reused upstream
        connection turns out closed (``proxy.upstream.client``). Not for a body the adapter
        tags, which is rewritten as it is read."""
        content = ex.request.content
        if not content.is_eof() or content.exception() is not None:
            return None
        body = content.read_nowait()
        limit = self._config.max_body_size
        if limit is not None and len(body) > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes")
        ex.call.bytes_in += len(body)
        return body

    async def _body(self, ex: Exchange) -> AsyncIterator[bytes]:
        """The client's body as it arrives, cut at ``--max-body-size`` (413) or when it stalls
        for ``--body-timeout`` (408). The upstream request wraps what this raises in its
        own error, so the reason is kept on the exchange too."""
        limit = self._config.max_body_size
        try:
            async for chunk in ex.request.content.chunks(self._config.body_timeout):
                ex.call.bytes_in += len(chunk)
                if limit is not None and ex.call.bytes_in > limit:
                    raise BodyTooLarge(f"request body exceeds {limit} bytes")
                yield chunk
        except BodyStalled as exc:
            ex.body_error = BodyTimeout(str(exc))
            raise ex.body_error from exc
        except (BodyTooLarge, BadBody) as exc:
            ex.body_error = exc
            raise

    def _respond(self, ex: Exchange, upstream: Response) -> Stream:
        """The client's response to ``upstream``'s, its head fixed (it leaves with the body's
        first bytes)."""
        request, call = ex.request, ex.call
        assert call.request_id is not None
        fields = client_response_head(upstream.fields, request_id=call.request_id)
        response = Stream(upstream.status, upstream.reason, fields=fields)
        if self._state.draining:
            response.force_close()
        try:
            response.start(request)
        except ConnectionResetError as exc:
            raise ClientGone(f"the client left before the response began: {exc}") from exc
        ex.response, call.stage, call.status = response, Stage.STREAMING, upstream.status
        return response

    def _prepared(self, ex: Exchange) -> Stream | None:
        """The response already started; close the client connection so it cannot look complete."""
        ex.request.connection.close()
        return ex.response

    def _error(self, ex: Exchange, exc: ProxyError) -> Answer | Stream | None:
        call = ex.call
        if call.reason is Reason.EXPLICIT and isinstance(exc, UpstreamError):
            exc = CancelledById("request cancelled (explicit)")  # its upstream closed for it
        call.outcome = call.outcome if call.outcome is Outcome.CANCELLED else exc.outcome
        call.error = exc.message
        if ex.response is not None and ex.response.sent:
            return self._prepared(ex)
        call.status = exc.status
        response = error_answer(exc.status, exc.message, exc.kind)
        if call.request_id is not None:
            response.headers[REQUEST_ID] = call.request_id
        if isinstance(exc, Overloaded):
            response.headers["Retry-After"] = "1"
        # An unread body (413, or a call refused before reading it) must not be drained from a
        # client that may send it slowly: the connection closes instead.
        unread = not ex.request.content.is_eof()
        if self._state.draining or unread or isinstance(exc, ProxyTimeout):
            response.force_close()
        return response
