"""Several API processes, one gateway: how a cancel finds its request (``--api-processes P``).

Each API process serves the shared HTTP and gRPC ports (the kernel spreads connections over
them) and runs the requests it accepts on its own engine workers; its :class:`CallRegistry`
holds them. What must hold across processes, the cancel contract, rests on one rule:

**Every request id has a home process**, ``crc32(id) % P``. The home keeps the id's entry in
its :class:`Directory`: which process runs it (live), that it ended (with its tokens), or a
tombstone (a cancel that came first). So:

- *open* (a call, or an aliased request of a gRPC stream): the accepting process registers the
  id locally, then claims it at its home. The home refuses a duplicate in flight anywhere
  (409) or spends a tombstone (the request is refused as cancelled before it arrived, wherever
  it landed). When the call ends, the owner tells the home (one message, no answer awaited).
- *cancel* accepted by process C: if C runs the id, it cancels it (no hop). Otherwise C asks
  the home (hop 1); the home cancels it if it runs it, else asks the owner (hop 2) and passes
  the owner's answer back (``cancelled`` with phase and tokens). An id that ended answers
  ``finished`` from the home's directory; an unknown id leaves a tombstone at the home, 404.
  A cancel therefore crosses at most two hops; ``hangup_gateway_cancel_forward_seconds``
  measures them.
- *home unreachable* (a process restarting): a claim goes ahead unchecked (logged), a cancel
  asks every sibling instead. A process that starts says hello to its siblings: they forget
  what its previous life owned (those calls died with it) and send it the entries whose home
  it is, so its directory is whole again. Tombstones and ended ids a dead home held are lost.
- ``GET /v2/requests`` and ``/metrics`` ask every sibling and answer for the whole gateway:
  counters and histograms come from prometheus_client's multiprocess files (they keep what a
  process that died had counted); in-flight and engine-load gauges are read live from each
  process and summed (worker labels are global indices, so they do not collide); the
  model-server protocol's gauges (``gateway_server.pool_metrics``) combine every process's
  worker loads into one series each.

The channel: one Unix socket per process in the gateway's private run directory, JSON lines,
one persistent connection per pair, answers matched by a sequence number. Every question has
a deadline (a sibling that does not answer is treated as unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway_server.errors import (
    CancelledBeforeArrival,
    DuplicateRequestId,
    GatewayError,
    RequestNotFound,
)
from gateway_server.metrics import GatewayMetrics, WorkerLoad
from gateway_server.pool_metrics import PoolProtocolCollector
from gateway_server.processes import ApiProcess
from gateway_server.registry import CallRegistry, Remembered, not_found
from hangup_contract.cancel import CancelAnswer
from hangup_contract.runtime.logs import log_event
from hangup_contract.vocabulary import CancelState, Reason

log = logging.getLogger("hangup.gateway")

_LINE_LIMIT = 64 * 1024 * 1024  # a /v2/requests answer of a busy process is one line
_ASK_WAIT = 5.0  # seconds a sibling has to answer a claim, a listing or its gauges
_CANCEL_WAIT = 30.0  # seconds for a forwarded cancel (the owner waits for its engines' abort)

Message = dict[str, Any]


def home_of(request_id: str, processes: int) -> int:
    """The process whose directory holds ``request_id``'s entry (stable across processes)."""
    return zlib.crc32(request_id.encode("utf-8", "surrogatepass")) % processes


def socket_path(run_dir: Path, slot: int) -> Path:
    return run_dir / f"api-{slot}.sock"


class SiblingUnreachable(Exception):
    """A sibling did not answer (not running, restarting, or past the deadline)."""


class Directory:
    """The ids whose home is this process: where each runs, which ended, which were cancelled
    before they arrived. Bounded like the registry (same TTLs and limit)."""

    def __init__(self, tombstone_ttl: float, finished_ttl: float = 600.0,
                 max_remembered: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.live: dict[str, int] = {}  # id -> owner
        self.ended = Remembered[int](finished_ttl, max_remembered, clock)
        self.tombstones = Remembered[Reason](tombstone_ttl, max_remembered, clock)

    def claim(self, request_id: str, owner: int) -> None:
        """Record that ``owner`` runs ``request_id``. Raises DuplicateRequestId or
        CancelledBeforeArrival (the tombstone is spent)."""
        if request_id in self.live:
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        reason = self.tombstones.pop(request_id)
        if reason is not None:
            raise CancelledBeforeArrival(request_id, reason)
        self.live[request_id] = owner

    def release(self, request_id: str, owner: int, tokens: int) -> None:
        if self.live.get(request_id) == owner:
            del self.live[request_id]
            self.ended.put(request_id, tokens)

    def forget(self, owner: int) -> None:
        """``owner`` started afresh: what it ran before died with it."""
        for request_id in [i for i, o in self.live.items() if o == owner]:
            del self.live[request_id]


class _Peer:
    """The connection to one sibling: questions out, answers matched by sequence number."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._seq = 0
        self._connecting = asyncio.Lock()
        self._reading: asyncio.Task[None] | None = None

    async def ask(self, message: Message, wait: float = _ASK_WAIT) -> Message:
        try:
            async with asyncio.timeout(wait):
                writer = self._writer
                if writer is None or writer.is_closing():
                    writer = await self._connect()
                self._seq += 1
                seq = self._seq
                answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
                self._pending[seq] = answer
                writer.write(_line({**message, "n": seq}))
                try:
                    return await answer
                finally:
                    self._pending.pop(seq, None)
        except (OSError, TimeoutError) as exc:
            raise SiblingUnreachable(f"{self._path.name}: {exc or type(exc).__name__}") from exc

    def tell(self, message: Message) -> None:
        """Send without waiting for an answer (best effort: dropped when not connected)."""
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.write(_line(message))
        else:
            asyncio.get_running_loop().create_task(self._tell_later(message))

    async def _tell_later(self, message: Message) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            writer = await asyncio.wait_for(self._connect(), _ASK_WAIT)
            writer.write(_line(message))

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                reader, writer = await asyncio.open_unix_connection(self._path, limit=_LINE_LIMIT)
                self._writer = writer
                self._reading = asyncio.get_running_loop().create_task(self._read(reader))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                answer = self._pending.get(message.get("n", -1))
                if answer is not None and not answer.done():
                    answer.set_result(message)
        except (OSError, ValueError):
            pass
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(ConnectionResetError("sibling closed the connection"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)


def _line(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class Siblings:
    """This API process's side of the gateway: its directory, its channel, its siblings.

    ``live``: the collectors of this process's in-flight and engine-load gauges (read at
    every scrape, here and for siblings)."""

    def __init__(
        self, me: ApiProcess, registry: CallRegistry, metrics: GatewayMetrics,
        live: Iterable[Collector], *, tombstone_ttl: float, model: str,
    ) -> None:  # fmt: skip
        self.slot = me.slot
        self.count = me.count
        self._dir = me.run_dir
        self._registry = registry
        self._metrics = metrics
        self.directory = Directory(tombstone_ttl)
        self._peers = {i: _Peer(socket_path(me.run_dir, i)) for i in range(me.count)
                       if i != me.slot}  # fmt: skip
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.describe_calls: Callable[[], list[dict[str, object]]] = list
        self.worker_loads: Callable[[], Iterable[WorkerLoad]] = list
        self._pod_loads: list[WorkerLoad] = []  # every process's, read at this scrape
        self._live = CollectorRegistry(auto_describe=False)
        for collector in live:
            self._live.register(collector)
        self._gathered = _Gathered()
        self._exposed = CollectorRegistry(auto_describe=False)
        self._exposed.register(_Ours(MultiProcessCollector(None, path=str(me.run_dir))))  # type: ignore[no-untyped-call]
        self._exposed.register(self._gathered)
        pool = PoolProtocolCollector(model, lambda: self._pod_loads)
        self._exposed.register(pool)
        self._pool = CollectorRegistry(auto_describe=False)
        self._pool.register(pool)
        restarts = Counter("hangup_gateway_api_process_restarts", "API processes that exited "
                           "and were started again.", registry=CollectorRegistry())  # fmt: skip
        if me.restarted:
            restarts.inc()

    def home(self, request_id: str) -> int:
        return home_of(request_id, self.count)

    # -- start and stop --------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, then say hello: siblings forget this slot's previous life and send the
        entries whose home this process is."""
        path = socket_path(self._dir, self.slot)
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path, limit=_LINE_LIMIT)
        hellos = await self._ask_all({"op": "hello", "slot": self.slot})
        for peer, answer in hellos:
            for request_id in answer.get("live", ()):
                self.directory.live.setdefault(request_id, peer)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(p.close() for p in self._peers.values()), return_exceptions=True)

    # -- what the service calls ------------------------------------------------------------

    async def claim(self, request_id: str) -> None:
        """Claim ``request_id`` for this process at its home (it must be open here already).
        Raises DuplicateRequestId or CancelledBeforeArrival."""
        home = self.home(request_id)
        if home == self.slot:
            self.directory.claim(request_id, self.slot)
            return
        try:
            answer = await self._peers[home].ask(
                {"op": "claim", "id": request_id, "owner": self.slot}
            )
        except SiblingUnreachable as exc:
            log_event(log, "claim_unchecked", logging.WARNING, request_id=request_id,
                      home=home, error=str(exc))  # fmt: skip
            return
        error = answer.get("error")
        if error == "duplicate":
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        if error == "cancelled":
            raise CancelledBeforeArrival(request_id, Reason.parse(answer["reason"]))

    def release(self, request_id: str, tokens: int) -> None:
        """``request_id`` ended here after ``tokens`` tokens (its home remembers)."""
        home = self.home(request_id)
        if home == self.slot:
            self.directory.release(request_id, self.slot, tokens)
        else:
            message = {"op": "release", "id": request_id, "owner": self.slot, "tokens": tokens}
            self._peers[home].tell(message)

    async def cancel(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The cancel contract over every process (see the module docstring)."""
        answer = await self._registry.cancel_live(request_id, reason)
        if answer is not None:
            return answer
        home = self.home(request_id)
        if home == self.slot:
            return await self._cancel_at_home(request_id, reason)
        started = time.perf_counter()
        try:
            reply = await self._peers[home].ask(
                {"op": "cancel", "id": request_id, "reason": reason.value}, _CANCEL_WAIT
            )
        except SiblingUnreachable as exc:
            log_event(log, "cancel_home_unreachable", logging.WARNING, request_id=request_id,
                      home=home, error=str(exc))  # fmt: skip
            return await self._cancel_everywhere(request_id, reason)
        finally:
            self._metrics.cancel_forward.observe(time.perf_counter() - started)
        return _answer_of(reply, request_id)

    async def all_calls(self) -> list[dict[str, object]]:
        calls = self.describe_calls()
        for _, answer in await self._ask_all({"op": "calls"}):
            calls.extend(answer.get("calls", ()))
        return calls

    async def exposition(self) -> bytes:
        """``/metrics`` for the whole gateway: every process's counters and histograms (the
        multiprocess files) and every live process's gauges, summed."""
        answers = await self._ask_all({"op": "gauges"})
        self._gathered.families = [self._gauges(), *(a.get("families", []) for _, a in answers)]
        self._gathered.processes = 1 + len(answers)
        self._pod_loads = self._loads_with(answers)
        return generate_latest(self._exposed)

    async def pool_exposition(self) -> bytes:
        """``/metrics/pool``: the Endpoint Picker's gauges over every process's workers (their
        loads only, not every gauge: an EPP asks every 50 ms)."""
        self._pod_loads = self._loads_with(await self._ask_all({"op": "loads"}))
        return generate_latest(self._pool)

    def _loads_with(self, answers: list[tuple[int, Message]]) -> list[WorkerLoad]:
        """This process's worker loads and those the siblings' ``answers`` carry."""
        theirs = [WorkerLoad(*fields) for _, a in answers for fields in a.get("loads", ())]
        return [*self.worker_loads(), *theirs]

    def _gauges(self) -> list[Any]:
        """This process's live gauges as ``[name, help, [[sample, labels, value], ...]]``."""
        return [[f.name, f.documentation, [[x.name, x.labels, x.value] for x in f.samples]]
                for f in self._live.collect()]  # fmt: skip

    # -- the home's and the owner's side ---------------------------------------------------

    async def _cancel_at_home(self, request_id: str, reason: Reason) -> CancelAnswer:
        answer = await self._registry.cancel_live(request_id, reason)
        if answer is not None:
            return answer
        owner = self.directory.live.get(request_id)
        if owner is not None and owner != self.slot:
            started = time.perf_counter()
            try:
                reply = await self._peers[owner].ask(
                    {"op": "cancel_owned", "id": request_id, "reason": reason.value},
                    _CANCEL_WAIT,
                )  # fmt: skip
            except SiblingUnreachable:
                # The owner died: its calls ended with it.
                self.directory.release(request_id, owner, 0)
                return CancelAnswer(request_id, CancelState.FINISHED, None, 0)
            finally:
                self._metrics.cancel_forward.observe(time.perf_counter() - started)
            return _answer_of(reply, request_id)
        tokens = self.directory.ended.get(request_id)
        if tokens is not None:
            return CancelAnswer(request_id, CancelState.FINISHED, None, tokens)
        finished = self._registry.finished(request_id)
        if finished is not None:
            return finished
        self.directory.tombstones.put(request_id, reason)
        raise not_found(request_id)

    async def _cancel_owned(self, request_id: str, reason: Reason) -> CancelAnswer:
        answer = await self._registry.cancel_live(request_id, reason)
        answer = answer or self._registry.finished(request_id)
        if answer is None:
            raise not_found(request_id)
        return answer

    async def _cancel_everywhere(self, request_id: str, reason: Reason) -> CancelAnswer:
        """The home is unreachable: ask every sibling; the one running the id cancels it."""
        message = {"op": "cancel_owned", "id": request_id, "reason": reason.value}
        replies = await self._ask_all(message, _CANCEL_WAIT)
        answers = [_answer_of(r, request_id) for _, r in replies if "answer" in r]
        here = self._registry.finished(request_id)
        if here is not None:
            answers.append(here)
        if answers:  # a cancelled one first: only one process can have run it
            return min(answers, key=lambda a: a.state is not CancelState.CANCELLED)
        self._registry.leave_tombstone(request_id, reason)
        raise not_found(request_id)

    async def _ask_all(
        self, message: Message, wait: float = _ASK_WAIT
    ) -> list[tuple[int, Message]]:
        """Every reachable sibling's answer to ``message``."""
        slots = list(self._peers)
        answers = await asyncio.gather(
            *(self._peers[s].ask(message, wait) for s in slots), return_exceptions=True
        )
        return [(s, a) for s, a in zip(slots, answers, strict=True) if isinstance(a, dict)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                if message["op"] in ("cancel", "cancel_owned"):  # awaits engines: not inline
                    task = asyncio.get_running_loop().create_task(self._answer(message, writer))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    reply = self._handle(message)
                    if reply is not None:
                        writer.write(_line({**reply, "n": message["n"]}))
        except (OSError, ValueError, KeyError) as exc:
            log_event(log, "sibling_channel_error", logging.WARNING, error=repr(exc))
        finally:
            writer.close()

    def _handle(self, message: Message) -> Message | None:
        op = message["op"]
        if op == "claim":
            try:
                self.directory.claim(message["id"], message["owner"])
            except DuplicateRequestId:
                return {"error": "duplicate"}
            except CancelledBeforeArrival as exc:
                return {"error": "cancelled", "reason": exc.reason.value}
            return {"ok": True}
        if op == "release":
            self.directory.release(message["id"], message["owner"], message["tokens"])
            return None
        if op == "hello":
            self.directory.forget(message["slot"])
            mine = [i for i in self._registry.held_ids() if self.home(i) == message["slot"]]
            return {"live": mine}
        if op == "calls":
            return {"calls": self.describe_calls()}
        if op == "loads":
            return {"loads": [astuple(x) for x in self.worker_loads()]}
        if op == "gauges":
            return {"families": self._gauges(), "loads": [astuple(x) for x in self.worker_loads()]}
        raise KeyError(f"unknown operation {op!r}")

    async def _answer(self, message: Message, writer: asyncio.StreamWriter) -> None:
        reason = Reason.parse(message["reason"])
        act = self._cancel_at_home if message["op"] == "cancel" else self._cancel_owned
        try:
            answer = await act(message["id"], reason)
            reply: Message = {"answer": answer.to_json()}
        except RequestNotFound:
            reply = {"error": "not_found"}
        except Exception as exc:  # an engine failing its abort: the caller answers 500
            reply = {"error": str(exc) or type(exc).__name__}
        if not writer.is_closing():
            writer.write(_line({**reply, "n": message["n"]}))


class _Ours(Collector):
    """The gateway's own families of the multiprocess files. vLLM writes its metrics there too
    (it sees ``PROMETHEUS_MULTIPROC_DIR``), each process's engine as ``engine="0"``; the
    one-process gateway does not export them either."""

    def __init__(self, files: MultiProcessCollector) -> None:
        self._files = files

    def collect(self) -> Iterator[Metric]:
        for family in self._files.collect():  # type: ignore[no-untyped-call]
            if family.name.startswith("hangup_"):
                yield family


class _Gathered(Collector):
    """The gauges read from every process at this scrape, summed by series."""

    def __init__(self) -> None:
        self.families: list[list[Any]] = []
        self.processes = 1

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
        for families in self.families:
            for name, documentation, samples in families:
                series = merged.setdefault(name, (documentation, {}))[1]
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    series[key] = series.get(key, 0.0) + value
        for name, (documentation, series) in merged.items():
            family = Metric(name, documentation, "gauge")
            for (sample, labels), value in series.items():
                family.add_sample(sample, dict(labels), value)
            yield family
        yield GaugeMetricFamily("hangup_gateway_api_processes", "API processes serving "
                                "(answering their siblings at this scrape).",
                                value=self.processes)  # fmt: skip


def _answer_of(reply: Message, request_id: str) -> CancelAnswer:
    if "answer" in reply:
        return CancelAnswer.from_json(json.dumps(reply["answer"]))
    if reply.get("error") == "not_found":
        raise not_found(request_id)
    raise GatewayError(f"the API process running {request_id!r} failed the cancel: "
                       f"{reply.get('error')}")  # fmt: skip
