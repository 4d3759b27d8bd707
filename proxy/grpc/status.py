"""The upstream call's own status, kept from a grpc.aio race that would replace it with INTERNAL.

The upstream may end a call before it has read every request message: ``UNIMPLEMENTED`` for a
method it does not serve, ``UNAVAILABLE`` while it drains, ``INVALID_ARGUMENT`` for a refused id.
If the proxy's request pump has a write in flight at that moment, gRPC's core fails the write,
and grpc.aio (1.6x-1.8x) then stamps the call ``INTERNAL "Internal error from Core"`` over the
status it had already received, so the client would see INTERNAL instead of a status it can act
on (retry elsewhere, fix the call); how often it happened before this module is in
docs/benchmarks.md (the protocol fuzz).

:class:`StatusWatch` records every status the call is given (grpc.aio runs a call's done
callbacks each time it sets one) and returns the first that is not that stamp. It reads the
status from grpc.aio's call object, which has no public accessor for it; if a later grpc.aio
drops that attribute, the watch sees nothing and the call's own status is used, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

WRITE_RACE = "Internal error from Core"
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class StatusWatch:
    def __init__(self, call: grpc.aio.Call) -> None:
        self._call = call
        self._real: Any = None
        self._arrived = asyncio.Event()
        call.add_done_callback(self._record)

    def _record(self, call: grpc.aio.Call) -> None:
        status = getattr(getattr(call, "_cython_call", None), "_status", None)
        if status is not None and status.details() != WRITE_RACE and self._real is None:
            self._real = status
            self._arrived.set()

    async def status(
        self, code: grpc.StatusCode, details: str | None, trailing: Any, *, wait: float = 0.2
    ) -> tuple[grpc.StatusCode, str | None, Any]:
        """The call's status: ``(code, details, trailing)`` as read from the call, unless that
        is the write-race stamp, then the status the upstream sent (waiting up to ``wait``
        seconds for it to arrive)."""
        if code != grpc.StatusCode.INTERNAL or details != WRITE_RACE:
            return code, details, trailing
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), wait)
        if (real := self._real) is None:
            return code, details, trailing
        return (
            _CODES.get(real.code(), grpc.StatusCode.UNKNOWN),
            real.details(),
            real.trailing_metadata(),
        )
