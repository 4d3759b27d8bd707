"""Addresses as hangup's processes name them, and free ports to give them.

A ready file names each listener ``"host:port"``; a URL is ``http://host:port``; an IPv6 host is
in brackets (``[::1]:8080``). :func:`host_port` reads any of them into what a socket takes, and
:func:`port_of` the port alone: the one split of an address that ``bench/`` and the tests use.
:func:`free_ports` finds ports free on 127.0.0.1 for a server that cannot take port 0 (Triton,
Prometheus, the front doors): each bound at once, so that the ports differ, then let go (another
process may take one before the server does; the caller starts again then).
"""

from __future__ import annotations

import contextlib
import socket


def host_port(address: str) -> tuple[str, int]:
    """``("127.0.0.1", 8080)`` of ``127.0.0.1:8080`` or ``http://127.0.0.1:8080`` (a path after
    the port is left out); an IPv6 host without its brackets. Raises ValueError for an address
    with no port."""
    _, _, rest = address.rpartition("://")
    host, colon, port = rest.partition("/")[0].rpartition(":")
    if not colon:
        raise ValueError(f"no port in {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def port_of(address: str) -> int:
    """The port of an address :func:`host_port` reads."""
    return host_port(address)[1]


def free_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1 now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    return free_ports(1)[0]
