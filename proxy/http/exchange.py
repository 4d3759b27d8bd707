"""What the HTTP relay holds of one call (``proxy.http.relay``): the exchange (its request,
call, ending and upstream call, what was sent of the answer) and the sink that writes an
upstream body to the client as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable

from hangup_contract.usage import Usage
from proxy.calls.lifecycle import CallEnding
from proxy.calls.state import Call
from proxy.cancel.protocols import CancelTask
from proxy.errors import BadBody, BodyTimeout, BodyTooLarge, CancelledById, ClientGone
from proxy.http.relayed import usage_in
from proxy.labels import CancelResult
from proxy.messages import Request, Stream
from proxy.triton.bridge import Upstream
from proxy.upstream.client import UpstreamCall


class ClientSink:
    """Writes an upstream body to the client as it arrives (the response's head with its first
    bytes). A client that left is not written to: its hang-up ends the call
    (``HttpRelay.connection_lost``).

    What it keeps as it writes costs no parse (about 50 ns a write): the bytes and pieces
    written, and a reference to the last piece (:meth:`usage` reads it once, if the call ends
    cancelled)."""

    __slots__ = (
        "_call",
        "_connection",
        "_high",
        "_last",
        "_response",
        "_transport",
        "_watch",
    )

    def __init__(
        self,
        request: Request,
        response: Stream,
        call: Call,
        watch: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``watch``: shown each chunk until it answers True (the answer's first bytes read
        for its id, ``proxy.http.answer_ids``), then no more."""
        transport = request.connection.transport
        if transport is None or request.connection.closed:
            raise ClientGone("the client left before the response began")
        self._transport = transport
        self._connection = request.connection
        self._response = response
        self._call = call
        self._high = transport.get_write_buffer_limits()[1]
        self._watch = watch
        self._last = b""

    def write(self, chunk: bytes) -> None:
        if self._connection.closed:
            return
        watch = self._watch
        if watch is not None and watch(chunk):
            self._watch = None
        self._response.send(chunk)
        call = self._call
        call.bytes_out += len(chunk)
        call.chunks_out += 1
        self._last = chunk

    def usage(self) -> Usage | None:
        """The server's own usage at the end of what was relayed (``proxy.http.relayed``)."""
        return usage_in(self._last)

    def flush(self) -> None:
        self._response.flush()

    def full(self) -> bool:
        return not self._connection.closed and self._transport.get_write_buffer_size() > self._high

    async def drain(self) -> None:
        try:
            await self._connection.drain()
        except ConnectionResetError as exc:
            raise ClientGone(f"the client left mid-response: {exc}") from exc


class Exchange:
    """One request/response pair on the client side, with what has been sent so far."""

    __slots__ = (
        "body_error",
        "bridged",
        "call",
        "ending",
        "request",
        "response",
        "sink",
        "upstream_call",
    )

    def __init__(self, request: Request, call: Call, ending: CallEnding) -> None:
        self.request = request
        self.call = call
        self.ending = ending
        self.response: Stream | None = None
        self.body_error: BodyTooLarge | BodyTimeout | BadBody | None = None  # why the body was cut
        self.upstream_call: UpstreamCall | None = None
        self.bridged: Upstream | None = None  # the gRPC call, when the Triton bridge answers
        self.sink: ClientSink | None = None  # what writes the upstream's body, once it began

    def close_upstream(self) -> None:
        """Drop the upstream call (the bridge's gRPC call, cancelled); nothing if its answer
        was released."""
        if self.bridged is not None:
            self.bridged.cancel()
        if self.upstream_call is not None:
            self.upstream_call.close()

    def abort_upstream(self) -> None:
        """Drop the upstream call for a cancel by id, the relay still waiting on it: a head not
        yet come fails (499), a body being relayed breaks off (the client's stream is cut)."""
        if self.bridged is not None:
            self.bridged.cancel()
        if self.upstream_call is not None:
            self.upstream_call.abort(CancelledById("request cancelled (explicit)"))


def held_upstream(task: CancelTask) -> bool:
    """The upstream took the cancel (it held the call, or had ended it): it ends the call."""
    if task.cancelled():
        return False
    return task.result() in (CancelResult.OK, CancelResult.FINISHED)
