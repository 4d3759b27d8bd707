"""What the proxy's HTTP/1.1 core (``proxy.http.core``) returns: events, what the client sent,
and commands, what its connection must do. Frozen and compared by value (dataclasses; the head,
made for every request, a named tuple), so that a test reads as a table of bytes in and events
out.

Events, in the order the client's bytes carry them:

- :class:`RequestHead`: a request head that passed every rule; the :class:`Data` and the
  :class:`EndOfMessage` that follow are its body's, until the next head;
- :class:`BodyBroken`: the body of the last head breaks off (a broken chunk, a trailer over the
  limits); its reader gets the error, nothing more is read;
- :class:`Refused`: a head refused, with the status it is answered (the answer is a
  :class:`Send` that follows).

Commands:

- :class:`Serve`: hand the oldest request not yet served to the handler (one at a time);
- :class:`Send`: write these bytes to the client (a refusal's answer);
- :class:`PauseReading`, :class:`ResumeReading`: stop or start reading from the client;
- :class:`Linger`: end the sending side now (a FIN), read and drop what still comes, close
  after :attr:`Linger.seconds`;
- :class:`Close`: close the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from proxy.errors import BadBody, RemoteProtocolError

Headers = list[tuple[str, str]]


class RequestHead(NamedTuple):
    """A request head as the client sent it; strings decoded byte for byte (``surrogateescape``),
    fields in order with their repeats. ``headers`` is the request's own list from here on.

    A named tuple, where the other events are frozen dataclasses: one is made for every request,
    in one C call (a frozen dataclass sets each field through ``object.__setattr__``), and the
    glue makes its request from it in one more (``Request(connection, *head)``). Immutable and
    compared by value all the same; it also equals a plain tuple of its fields, which no other
    event is."""

    method: str
    target: str
    version: tuple[int, int]
    headers: Headers
    keep_alive: bool  # the client will send another request on this connection
    content_length: int | None
    chunked: bool


@dataclass(frozen=True, slots=True)
class Data:
    """Bytes of the last head's body, as they arrived (chunked encoding removed). The core makes
    it with :func:`data`."""

    data: bytes


@dataclass(frozen=True, slots=True)
class EndOfMessage:
    """The last head's body has ended (its trailer fields, if any, dropped)."""


@dataclass(frozen=True, slots=True)
class BodyBroken:
    """The last head's body breaks off: its reader gets ``error``."""

    error: BadBody


@dataclass(frozen=True, slots=True)
class Refused:
    """A head refused: answered with ``error.status`` (the :class:`Send` that follows)."""

    error: RemoteProtocolError


@dataclass(frozen=True, slots=True)
class Serve:
    """Hand the oldest request not yet served to the handler."""


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``data`` to the client."""

    data: bytes


@dataclass(frozen=True, slots=True)
class PauseReading:
    """Stop reading from the client."""


@dataclass(frozen=True, slots=True)
class ResumeReading:
    """Read from the client again."""


@dataclass(frozen=True, slots=True)
class Linger:
    """Send a FIN now, read and drop what the client still sends, close after ``seconds``
    (nginx's ``lingering_close``): a close over unread bytes would send a reset, which can
    destroy the answer before the client reads it."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection."""


Event = RequestHead | Data | EndOfMessage | BodyBroken | Refused
Command = Serve | Send | PauseReading | ResumeReading | Linger | Close

# The events and commands with no fields, one instance each.
END = EndOfMessage()
SERVE = Serve()
PAUSE = PauseReading()
RESUME = ResumeReading()
CLOSE = Close()


HeadFields = tuple[str, str, tuple[int, int], Headers, bool, int | None, bool]
request_head: Callable[[HeadFields], RequestHead] = partial(tuple.__new__, RequestHead)
"""``RequestHead(*fields)``, with no Python frame (the named tuple's own ``__new__`` is one):
what the core makes a head with."""

# The core makes a Data for each request with a body: made as below, not by the frozen
# dataclass's own __init__, which sets its field through object.__setattr__. The same object:
# equal, shown and frozen as the dataclass makes it.
_new = object.__new__
_DATA = getattr(Data, "data").__set__  # noqa: B009 (a slot's descriptor: mypy sees a field)


def data(body: bytes) -> Data:
    """``Data(body)``, made at a third of the cost."""
    made = _new(Data)
    _DATA(made, body)
    return made
