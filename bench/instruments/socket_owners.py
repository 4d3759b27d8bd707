"""Which process accepted a connection: how the kernel spread connections over processes that
share a port (``SO_REUSEPORT``), read from Linux's ``/proc`` while the connections are open.

:class:`Owners` samples, every ``interval`` seconds, the established TCP connections on the
server's port (``ss``, or ``/proc/net/tcp``: the server side's inode and the client's port) and
the socket inodes each of the server's processes holds (``/proc/PID/fd``); a client's local
port then names the process that accepted its call. Calls shorter than the interval may go
unseen; :meth:`Owners.count` says how many.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

_ESTABLISHED = "01"


def _server_sides(port: int) -> dict[int, int]:
    """inode -> client port, for established connections whose local port is ``port``: from
    ``ss`` (netlink: the kernel filters, and a table that changes while it is read loses no
    entry), else from ``/proc/net/tcp`` (read in pieces: under churn it can miss some)."""
    ss = shutil.which("ss")
    if ss is not None:
        command = [ss, "-tnHe", "state", "established", "sport", "=", f":{port}"]
        found: dict[int, int] = {}
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            fields = line.split()
            inode = next((f[4:] for f in fields if f.startswith("ino:")), None)
            if inode is not None and len(fields) >= 4:
                found[int(inode)] = int(fields[3].rsplit(":", 1)[1])
        return found
    return _proc_net_tcp(port)


def _proc_net_tcp(port: int) -> dict[int, int]:
    found: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] != _ESTABLISHED or int(fields[1].rsplit(":", 1)[1], 16) != port:
                    continue
                found[int(fields[9])] = int(fields[2].rsplit(":", 1)[1], 16)
    return found


def _sockets(pid: int) -> set[int]:
    """The socket inodes process ``pid`` holds."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


class Owners:
    """client port -> the pid (of ``pids``) that accepted it, from samples."""

    def __init__(self, port: int, pids: Sequence[int], interval: float = 0.1) -> None:
        self._port = port
        self._pids = list(pids)
        self._interval = interval
        self.owner: dict[int, int] = {}

    def sample(self) -> None:
        sides = _server_sides(self._port)
        for pid in self._pids:
            for inode in _sockets(pid) & sides.keys():
                self.owner[sides[inode]] = pid

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            self.sample()
            await asyncio.sleep(self._interval)  # a sampling period, not a wait for an event

    def count(self, ports: Iterable[int]) -> tuple[dict[int, int], int]:
        """(calls per pid, calls not seen) for the calls made from ``ports``."""
        per_pid: Counter[int] = Counter({pid: 0 for pid in self._pids})
        unseen = 0
        for port in ports:
            pid = self.owner.get(port)
            if pid is None:
                unseen += 1
            else:
                per_pid[pid] += 1
        return dict(per_pid), unseen
