"""A pytest plugin: a socket or transport a test leaves open fails that test, with where it was
made, instead of a later test where the garbage collector happens to find it.

- Every socket made in the pytest process (``socket.socket()``, and ``accept()``: a server's
  side of a connection) notes the stack that made it; an accepted one also names its listener.
- After a test's fixtures are all finalized (its event loop closed), if a socket made during
  the test is still open, or the test was its module's last (module-scoped fixtures finalized
  too), the garbage is collected with every ``ResourceWarning`` recorded. What is reported is
  what nothing references any more and nobody closed: a leak. Sockets that module- or
  session-scoped servers and clients hold on purpose are referenced, so they are never
  reported; nor are sockets in the gateway's and proxy's own processes (not this one). A
  socket kept past its test (a module-level reference) and dropped by a later one is reported
  at the end of its module, with where it was made.

Why not tracemalloc, which would name every object's allocation: tracing every allocation of
this process tripled the in-process tier's time (70 s to 205 s), and the in-process servers
share this process with their tests. Noting a stack per socket costs nothing measurable.
"""

from __future__ import annotations

import gc
import socket
import traceback
import warnings
import weakref
from collections.abc import Generator
from typing import Any

import pytest

_FRAMES = 12  # of the making stack, innermost last
_sites: dict[int, str] = {}  # id(socket) -> where it was made, for the sockets alive
_alive: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # every socket not collected yet
_made: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # during the current test
_original_init = socket.socket.__init__
_original_accept = socket.socket.accept


def _init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    _sites[id(self)] = "".join(traceback.format_stack(limit=_FRAMES)[:-1])
    _alive.add(self)
    _made.add(self)


def _accept(self: socket.socket) -> tuple[socket.socket, Any]:
    conn, address = _original_accept(self)
    listener = _sites.get(id(self), "(a listener made before this test)\n")
    _sites[id(conn)] = f"accepted by the listener made at:\n{listener}"
    return conn, address


def pytest_configure(config: pytest.Config) -> None:
    socket.socket.__init__ = _init  # type: ignore[method-assign]
    socket.socket.accept = _accept  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    socket.socket.__init__ = _original_init  # type: ignore[method-assign]
    socket.socket.accept = _original_accept  # type: ignore[method-assign]


def pytest_collection_finish(session: pytest.Session) -> None:
    # What exists once the tests are collected (imports, modules, fixtures' definitions) is
    # kept for good: the collection after each test then looks only at what tests made.
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _made.clear()
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    result = yield  # every fixture of the test finalized (and the module's, if it was its last)
    module_ended = nextitem is None or nextitem.module is not getattr(item, "module", None)
    made_open = any(s.fileno() != -1 for s in _made)
    leaks = _leaks() if made_open or module_ended else []
    _made.clear()
    alive = {id(s) for s in _alive}
    for key in [k for k in _sites if k not in alive]:
        del _sites[key]
    if leaks:
        pytest.fail("left open by this test:\n\n" + "\n\n".join(leaks), pytrace=False)
    return result


def _leaks() -> list[str]:
    """What the garbage collector finds open now: each socket once (its transport's warning and
    its own, whichever of the two the collector finalized first), and where it was made."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    messages: dict[int, list[str]] = {}  # id(socket) -> what was said of it, in order
    for warning in caught:
        if not issubclass(warning.category, ResourceWarning):
            continue
        source = warning.source
        sock = getattr(source, "_sock", source)  # a transport's socket, or the socket itself
        messages.setdefault(id(sock), []).append(str(warning.message))
        del source, sock
    caught.clear()
    unknown = "(made before this test, or not a socket)\n"
    return [
        "\n".join(said) + "\nmade at:\n" + _sites.get(key, unknown)
        for key, said in messages.items()
    ]
