"""One HTTP listening socket for several processes of one server, taken from by the least loaded.

With ``SO_REUSEPORT`` each process listens on a socket of its own and the kernel hashes every new
connection to one of them: it spreads connections, not load (at 64 connections over four
processes one held 2.6 times as many as another), a process that stalls (a long pause, a
debugger, SIGSTOP) keeps every connection hashed to it waiting, and one that dies resets those
still in its queue. Here the supervisor opens one listening socket (:class:`SharedListener`) and
every child inherits it, so the queue outlives any child; a child takes a connection
(:class:`BalancedAcceptor`) only while it holds no more open connections than the least loaded
of its live siblings, which it reads from a board (:class:`Board`, a small file every process
maps: per slot its open connections and how many it has accepted).

Every child watching the socket is woken for each new connection; the ones that are not the
least loaded stop watching for ``PATIENCE_S``. If in that time no sibling accepted anything (the
least loaded ones are busy, as when a CPU quota throttles them, or stalled, or gone and not yet
marked so), the waiting child, which is running, takes what waits: what it lacks of an even
share of every connection open or queued (the queue's length is the listening socket's
``TCP_INFO``), at least one; then it looks again, and takes one, two, four (``_TAKEN_AT_ONCE``)
each time its siblings still took nothing. A busy or stalled process delays a new connection by
that much, never holds it, and where CPU is the limit connections go to the processes that have
it. Two ways this went wrong before, both measured (docs/benchmarks.md): taking up to 16 at once
let a sibling busy for a moment (one long pass of its event loop) lose its share of a burst (four
gateway API processes, each always busy, at 64 streams held from 2 to 40 connections each; now
mostly 13 to 19); taking one at a time left four proxy workers at 0.02 of a CPU quota each (a
run window of 2 ms in 100) taking one new connection a window, and relaying half of what they
could. A child marks its slot absent when it stops accepting (a drain); the supervisor marks the
slot of a child that exited.

Only the HTTP listener is shared: grpcio binds its own sockets, so the gRPC ports stay with
``SO_REUSEPORT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mmap
import os
import socket
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

log = logging.getLogger("hangup.shared_listener")

FD_ENV = "HANGUP_SHARED_LISTENER_FD"  # in a child: the inherited listening socket's descriptor
BOARD_ENV = "HANGUP_SHARED_LISTENER_BOARD"  # the board's path
SLOT_ENV = "HANGUP_SHARED_LISTENER_SLOT"  # this child's slot on it

PATIENCE_S = 0.002
"""How long a child that is not the least loaded leaves a new connection to its siblings."""
_TAKEN_AT_ONCE = 4  # the most a process takes at once when its less loaded siblings take none
_ACCEPT_ERROR_PAUSE_S = 0.1  # out of descriptors or memory: accept again after this long
_ABSENT = -1
_SLOT = struct.Struct("=qq")  # open connections (-1: absent), connections accepted in all
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)  # Linux's
_UNACKED = struct.Struct("=24xI")  # tcp_info's tcpi_unacked: after 8 one-byte fields and 4 u32s


class Board:
    """Per slot, open connections and connections accepted, in a file each process maps.

    Each slot is written by one process only (the supervisor writes a slot only once its child
    exited), with aligned 8-byte stores; a reader may see a count a moment old, never a torn one.
    """

    def __init__(self, path: Path, slots: int) -> None:
        self.path = path
        self.slots = slots
        with path.open("r+b") as file:
            self._map = mmap.mmap(file.fileno(), slots * _SLOT.size)
        self._all = struct.Struct(f"={2 * slots}q")

    @classmethod
    def create(cls, path: Path, slots: int) -> Board:
        path.write_bytes(_SLOT.pack(_ABSENT, 0) * slots)
        return cls(path, slots)

    def set_open(self, slot: int, count: int) -> None:
        struct.pack_into("=q", self._map, slot * _SLOT.size, count)

    def accepted(self, slot: int) -> None:
        offset = slot * _SLOT.size + 8
        (total,) = struct.unpack_from("=q", self._map, offset)
        struct.pack_into("=q", self._map, offset, total + 1)

    def read(self) -> tuple[list[int], int]:
        """Open connections per slot (-1: absent), and connections accepted by all slots."""
        values = self._all.unpack_from(self._map)
        return list(values[0::2]), sum(values[1::2])

    def close(self) -> None:
        self._map.close()


class SharedListener:
    """The supervisor's side: the listening socket its children inherit, and their board."""

    def __init__(self, host: str, port: int, slots: int, run_dir: Path, backlog: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=backlog)
        self.board = Board.create(run_dir / "http-listener.board", slots)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def fd(self) -> int:
        return self.sock.fileno()

    def child_env(self, slot: int) -> Mapping[str, str]:
        return {FD_ENV: str(self.fd), BOARD_ENV: str(self.board.path), SLOT_ENV: str(slot)}

    def stop_listening(self) -> None:
        """Drop the supervisor's hold on the socket (a drain): it closes once every child has
        stopped accepting, and new connections are refused instead of queueing for nobody."""
        self.sock.close()

    def exited(self, slot: int) -> None:
        """The child in ``slot`` exited: its siblings no longer wait for it."""
        self.board.set_open(slot, _ABSENT)

    def close(self) -> None:
        self.board.close()
        self.sock.close()


@contextlib.contextmanager
def shared_listener(
    host: str, port: int, slots: int, run_dir: Path, backlog: int = 1024
) -> Iterator[SharedListener]:
    listener = SharedListener(host, port, slots, run_dir, backlog)
    try:
        yield listener
    finally:
        listener.close()


class BalancedAcceptor:
    """A child's side: accepts connections from the inherited socket for ``protocol_factory``
    (an HTTP server's), one at a time, while this process is the least loaded.

    ``connections`` returns how many connections the server holds; call :meth:`changed` when it
    changes (a connection made or lost) so that the board follows.
    """

    def __init__(
        self,
        sock: socket.socket,
        board: Board,
        slot: int,
        protocol_factory: Callable[[], asyncio.Protocol],
        connections: Callable[[], int],
    ) -> None:
        self.sock = sock
        self._board = board
        self._slot = slot
        self._factory = protocol_factory
        self._connections = connections
        self._pending = 0  # accepted, transport not made yet
        self._loop = asyncio.get_running_loop()
        self._watching = False
        self._waiting: asyncio.TimerHandle | None = None
        self._taking = 0  # taken after the last wait in which siblings took nothing (then 2x)
        self._stopped = False
        self._tasks: set[asyncio.Task[object]] = set()

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str],
        protocol_factory: Callable[[], asyncio.Protocol],
        connections: Callable[[], int],
    ) -> BalancedAcceptor | None:
        """The acceptor for the socket a supervisor passed down, or None when there is none."""
        if FD_ENV not in environ:
            return None
        sock = socket.socket(fileno=int(environ[FD_ENV]))
        sock.setblocking(False)
        board = Board(Path(environ[BOARD_ENV]), _slots(Path(environ[BOARD_ENV])))
        return cls(sock, board, int(environ[SLOT_ENV]), protocol_factory, connections)

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> None:
        self.changed()
        self._watch()

    def stop(self) -> None:
        """Accept no more; siblings stop waiting for this process (its connections stay)."""
        if self._stopped:
            return
        self._stopped = True
        self._unwatch()
        if self._waiting is not None:
            self._waiting.cancel()
        self._board.set_open(self._slot, _ABSENT)
        self._board.close()
        self.sock.close()

    def changed(self) -> None:
        if not self._stopped:
            self._board.set_open(self._slot, self._connections() + self._pending)

    def _watch(self) -> None:
        if not self._watching and not self._stopped:
            self._loop.add_reader(self.sock.fileno(), self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _readable(self) -> None:
        counts, accepted = self._board.read()
        mine = self._connections() + self._pending
        others = [n for slot, n in enumerate(counts) if slot != self._slot and n >= 0]
        if others and mine > min(others):
            self._step_back(accepted)
        else:
            self._taking = 0
            self._accept()

    def _step_back(self, accepted: int) -> None:
        """Leave the connection to a sibling with fewer; take it if none did in ``PATIENCE_S``."""
        self._unwatch()
        self._waiting = self._loop.call_later(PATIENCE_S, self._after_waiting, accepted)

    def _after_waiting(self, accepted_before: int) -> None:
        self._waiting = None
        if self._stopped:
            return
        counts, accepted = self._board.read()
        if accepted == accepted_before:
            # No sibling took anything: the less loaded ones are busy (or stalled), so this
            # process, which is running, takes what waits: up to its share of every connection
            # open or queued, and at least one, then twice as many each time they still take
            # nothing (up to a bound), looking again in between.
            self._taking = min(2 * self._taking, _TAKEN_AT_ONCE) or 1
            for _ in range(max(self._taking, self._short_of_share(counts))):
                if not self._accept():
                    break
        else:
            self._taking = 0
        if self._waiting is None:  # not pausing after an error accepting
            self._watch()

    def _short_of_share(self, counts: list[int]) -> int:
        """How many connections this process lacks of an even share of the live processes' open
        connections (``counts``, from the board) and those waiting in the listening socket's
        queue."""
        mine = self._connections() + self._pending
        others = [n for slot, n in enumerate(counts) if slot != self._slot and n >= 0]
        everyone = mine + sum(others) + queued(self.sock)
        return -(-everyone // (len(others) + 1)) - mine

    def _accept(self) -> bool:
        """Take one connection; whether there was one."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return False  # a sibling took it
        except ConnectionAbortedError:
            return False  # its client reset it while it waited: the next wake-up goes on
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            log.warning("cannot accept a connection: %s", exc.strerror)
            self._unwatch()
            self._waiting = self._loop.call_later(_ACCEPT_ERROR_PAUSE_S, self._after_pause)
            return False
        conn.setblocking(False)
        self._board.accepted(self._slot)
        self._pending += 1
        self.changed()
        task = self._loop.create_task(self._connect(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _after_pause(self) -> None:
        self._waiting = None
        self._watch()

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:
            conn.close()  # the client left before its transport was made
        finally:
            self._pending -= 1
            self.changed()


def queued(sock: socket.socket) -> int:
    """Connections waiting in a listening TCP socket's accept queue (Linux reports the queue's
    length as ``tcpi_unacked`` of ``TCP_INFO`` on a listening socket); 0 where it cannot be read."""
    if _TCP_INFO is None:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _UNACKED.size)
    except OSError:
        return 0
    if len(info) < _UNACKED.size:
        return 0
    return int(_UNACKED.unpack_from(info)[0])


def _slots(path: Path) -> int:
    return os.path.getsize(path) // _SLOT.size
