"""The API processes' vocabulary on the sibling channel (:mod:`hangup_contract.runtime.siblings`).

Each process serves ``api-<slot>.sock`` in the gateway's private run directory; the channel
(one connection kept to each sibling, questions numbered, a deadline on each, its bounds) is the
one the proxy's workers use too. What is asked is an :class:`Op`, with the fields its handler
reads; the handlers are registered by the modules that answer them (:mod:`.directory`,
:mod:`.metrics`, :mod:`.responses`). Every id in a message is held to the id or cancel rule
before it gets here, so every question is small.
"""

from __future__ import annotations

import enum
import logging

from gateway_server.siblings.processes import ApiProcess
from hangup_contract.runtime.siblings import Channel

log = logging.getLogger("hangup.gateway")

PREFIX = "api"  # the sockets' names: api-<slot>.sock
ASK_WAIT = 5.0  # seconds a sibling has to answer a claim, a listing or its gauges


class Op(enum.StrEnum):
    """What one API process asks or tells another (the message's ``op``)."""

    HELLO = "hello"
    """A process (re)started: forget what its previous life ran; send the ids it is home of."""
    CLAIM = "claim"
    """To an id's home: this process runs the id (refused for a duplicate or a tombstone)."""
    RELEASE = "release"
    """To an id's home, a notice: the id ended here after so many tokens."""
    CANCEL = "cancel"
    """To an id's home: cancel it wherever it runs."""
    CANCEL_OWNED = "cancel_owned"
    """To the process running an id (or every process, the home being unreachable)."""
    CANCEL_GROUP = "cancel_group"
    """To every process: cancel the calls of a group you run, refuse its calls for a while."""
    CALLS = "calls"
    """The calls in flight (``GET /v2/requests``)."""
    LOADS = "loads"
    """The engine workers' loads (``/metrics/pool``)."""
    GAUGES = "gauges"
    """The live gauges and the workers' loads (``/metrics``)."""
    CANCEL_RESPONSE = "cancel_response"
    """To a response id's home (the process that made it and holds its record): cancel it."""
    RESPONSE = "response"
    """To a response id's home: the stored response's object (``GET``)."""
    DELETE_RESPONSE = "delete_response"
    """To a response id's home: forget the stored response (``DELETE``)."""
    RESPONSE_TURNS = "response_turns"
    """To a response id's home: the turns a ``previous_response_id`` naming it continues."""
    RESPONSE_EVENTS = "response_events"
    """To a response id's home: a page of a background response's events after a number."""


def channel_of(me: ApiProcess) -> Channel:
    """API process ``me``'s end of the channel."""
    return Channel(me.run_dir, PREFIX, me.slot, me.count, wait=ASK_WAIT, log=log)
