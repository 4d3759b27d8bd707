"""Benchmark: the proxy's own share of a hang-up's cancel, without the rest of the machine.

``bench.proxy.cancel`` measures hang-up → engine asked to abort through real processes, and on a
shared machine its figures move by a factor of ten from run to run. This measures the part the
proxy's code decides, in one process: the hangup adapter's ``send_now`` (building the cancel
request and writing it on an idle keep-alive connection, in the callback that saw the hang-up),
and the whole attempt (written → answer read → connection back in the pool) against a loopback
server that answers at once. Medians and p99 over ``--calls`` cancels, µs.

Run: ``.venv/bin/python -m bench.proxy.cancel_write`` (from the repository root; the tree the proxy
is imported from is the working directory's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from bench.instruments.stats import quantile
from hangup_contract.cancel_labels import Reason

ANSWER = b'{"request_id": "x", "state": "cancelled", "phase": "decode"}'
REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
    len(ANSWER),
    ANSWER,
)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(REPLY)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _adapter(url: str) -> Any:
    """The hangup HTTP cancel adapter of whichever tree is imported (its API changed)."""
    try:
        from proxy.cancel.http import HangupCancel, HttpCancelAdapter
    except ImportError:  # the proxy before its HTTP/1.1 client was one
        from proxy.cancel_http import HangupCancelAdapter  # type: ignore[import-not-found]

        return HangupCancelAdapter(url, "token", 5.0)
    return HttpCancelAdapter(HangupCancel(), url, "token", 5.0)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    adapter = _adapter(url)
    await adapter.cancel("warm-up", Reason.CLIENT_DISCONNECT)  # one idle connection
    gc.collect()
    gc.freeze()  # as the proxy does at start-up (proxy/cli.py)
    write_us: list[float] = []
    attempt_us: list[float] = []
    for i in range(args.calls):
        started = time.perf_counter()
        task = adapter.send_now(f"id-{i}", Reason.CLIENT_DISCONNECT)
        written = time.perf_counter()
        if task is None:
            raise RuntimeError("no idle connection: the connection was not reused")
        await task
        attempt_us.append((time.perf_counter() - started) * 1e6)
        write_us.append((written - started) * 1e6)
    await adapter.close()
    server.close()
    await server.wait_closed()
    for name, values in (("send_now (in the callback)", write_us), ("whole attempt", attempt_us)):
        p50, p99 = statistics.median(values), quantile(values, 0.99)
        print(f"{name:>28}: p50 {p50:7.1f} us   p99 {p99:7.1f} us   ({len(values)} cancels)")


if __name__ == "__main__":
    try:
        import uvloop  # the proxy's event loop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(main())
    else:
        uvloop.run(main())
