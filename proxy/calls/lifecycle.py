"""How a relayed call ends, whatever its protocol: one sequence, decided here without sockets.

A call ends once, whichever comes first: the client hangs up (a closed connection, a cancelled
gRPC call, its deadline), the proxy stops it (``--max-request-duration``, shutdown), or the
upstream answers in full. The protocol adapters (``proxy.http.relay``, ``proxy.grpc.relay``)
say *when* each step below happens and *how* their upstream call closes; :class:`CallEnding`
(one per call) decides the rest, the same way for both:

1. :meth:`CallEnding.stop`: record why the call ends (reason, outcome ``cancelled``, the moment
   it was seen; a client that left before anything was sent gets the adapter's "gone" status),
   count it (client disconnects by stage, cancels by reason), and, when an upstream call is
   open and unfinished, submit the explicit cancel by id to the ``Canceller`` (a task of its own:
   it outlives the handler). Once per call: a later stop returns the first one's cancel. A
   ``detached`` call (a background response, ``proxy.cancel.responses``) is meant to outlive its
   client: its end is counted (client disconnects, outcome), but no cancel is made or counted.
2. :meth:`CallEnding.close_upstream`: close the upstream call once its cancel is answered, or
   after ``--stream-close-grace`` if that is slower; at once when no cancel is pending. Closing
   first would let the upstream record a bare disconnect instead of the real reason.
3. :meth:`CallEnding.finish`: count the outcome (for a call that ended cancelled, also what
   was relayed of it: bytes, chunks, the server's own usage if it sent one) and write the call's
   one log line (:func:`log_call`: ``msg`` ``call`` with ``Call.record()``), once its cancel has
   an answer, so the line carries ``cancel_result`` and ``cancel_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hangup_contract.cancel_labels import Reason
from proxy.calls.state import Call
from proxy.cancel.protocols import CancelTask, Submit
from proxy.labels import Outcome
from proxy.metrics import ProxyMetrics

CALL_LOGGER = "hangup.proxy.call"

PROXY_STOPPED = frozenset({Reason.SHUTDOWN, Reason.PROXY_TIMEOUT, Reason.EXPLICIT})
"""Reasons a call ends that are not its client's hang-up (not counted as client disconnects):
the proxy's own (a limit, shutdown) and a cancel by id on its API (an operator's, an edge's)."""


class CallEnding:
    """The end of one call: stop (once), close the upstream, finish (count and log once)."""

    def __init__(
        self,
        call: Call,
        metrics: ProxyMetrics,
        submit: Submit,
        *,
        close_grace: float,
        gone_status: int,
        log: Callable[[Call], None],
    ) -> None:
        self.call = call
        self._metrics = metrics
        self._submit = submit
        self._grace = close_grace
        self._gone_status = gone_status
        self._log = log
        self.upstream_open = False
        """An upstream call was sent under the call's id: there is something to cancel."""
        self.upstream_done = False
        """The upstream ended the call itself: nothing is left to cancel."""
        self.stopped = False
        self.cancel: CancelTask | None = None
        self._closed = False
        self._closed_event: asyncio.Event | None = None  # made only for a waiter

    def stop(self, reason: Reason) -> CancelTask | None:
        """Record that the call ends for ``reason`` and cancel it upstream. Once per call; a
        later call returns the first one's cancel (None when none was made)."""
        if self.stopped:
            return self.cancel
        self.stopped = True
        call, detected = self.call, time.monotonic()
        call.reason, call.outcome, call.stopped_at = reason, Outcome.CANCELLED, detected
        if reason not in PROXY_STOPPED:
            self._metrics.disconnected(call.protocol, call.stage)
            if call.status is None:
                call.status = self._gone_status
        if call.detached:
            return None
        self._metrics.cancelled(call.protocol, reason)
        if self.upstream_open and not self.upstream_done and call.request_id is not None:
            self.cancel = self._submit(call.request_id, reason, detected)
        return self.cancel

    def close_upstream(self, close: Callable[[], None]) -> None:
        """Run ``close`` (once): now when no cancel is pending, else when the cancel is answered
        or ``close_grace`` seconds have passed, whichever comes first."""

        cancel = self.cancel
        if cancel is None or cancel.done():
            self._close_once(close)
            return

        def once(*_: object) -> None:
            self._close_once(close)

        cancel.add_done_callback(once)
        asyncio.get_running_loop().call_later(self._grace, once)

    def _close_once(self, close: Callable[[], None]) -> None:
        if not self._closed:
            self._closed = True
            if self._closed_event is not None:
                self._closed_event.set()
            close()

    async def upstream_closed(self) -> None:
        """Return once :meth:`close_upstream` has closed the upstream call."""
        if self._closed:
            return
        if self._closed_event is None:
            self._closed_event = asyncio.Event()
        await self._closed_event.wait()

    def finish(self) -> None:
        """Count the call's outcome and write its log line (after its cancel's answer, if any).

        An outcome nobody recorded is an ``upstream_error``: a call is never counted completed
        by default.
        """
        call = self.call
        call.ended = time.monotonic()
        call.outcome = call.outcome or Outcome.UPSTREAM_ERROR
        self._metrics.finished(call.protocol, call.outcome)
        if call.outcome is Outcome.CANCELLED and call.reason is not None:
            relayed = (call.bytes_out, call.chunks_out)
            self._metrics.cancelled_relay(call.protocol, call.reason, relayed, call.usage)
        cancel = self.cancel
        if cancel is None:
            self._log(call)
            return

        def answered(task: CancelTask) -> None:
            call.cancel_answered_at = time.monotonic()
            if not task.cancelled():
                call.cancel_result = task.result()
            self._log(call)

        cancel.add_done_callback(answered)


_call_log = logging.getLogger(CALL_LOGGER)


def log_call(call: Call) -> None:
    """A call's one log record (the shape of ``hangup_contract.runtime.logs``), its fields
    gathered only when the record will be written."""
    if _call_log.isEnabledFor(logging.INFO):
        _call_log.info("call", extra={"fields": call.record()})
