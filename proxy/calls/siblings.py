"""With ``--workers``: what one worker asks the others about ids (issues 49, 59, 64).

A call lives in the worker that accepted its connection; a cancel by id is a call of its own,
accepted by whichever worker is least loaded, and a client's own id must be free in every worker
before a call goes upstream under it. So the workers ask one another over the sibling channel
(:mod:`hangup_contract.runtime.siblings`: a socket ``cancel-<slot>.sock`` each in the
supervisor's private directory, one connection kept to each other worker, its bounds, its
clocks at ``--cancel-attempt-timeout``); this module is the workers' vocabulary on it. Every
question goes to every other worker at once (:meth:`Siblings.ask`); a worker that is not running
(restarting) holds nothing (what it held died with it): its answer is :data:`NOT_RUNNING`.

- ``{"op": "cancel", "id"}``: end what you hold under the id, as your own cancel API would;
  answer ``{"state": "cancelled" | "finished" | "not_held"}``.
- ``"held"``: is a call held under the id (or under an id it extends with ``:``)? ``"held"`` or
  ``"free"``: a trusted id's call asks before it goes upstream.
- ``"bury"``: nobody held it: keep a tombstone (the call may arrive at any worker); ``"buried"``
  once kept: the cancel is answered after every worker's.
- ``"unbury"`` (a notice; asked, ``"unburied"``): a call arrived under the id elsewhere and spent
  its tombstone.
- ``"cancel_group"`` (the ``id`` is a group): end every call of the group you hold, refuse its
  calls for the ttl; answer ``{"entries": [{"request_id", "state", "client_request_id"?}, ...],
  "more": N}``: the entries that fit in :data:`ANSWER_BYTES`, and how many did not
  (:func:`fitted`).
- ``"list"`` (the ``id`` is a group, or empty for every call): the calls you hold, as the
  sidecar's list shows them (``ServerState.listing``), in the same shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from hangup_contract.runtime.sibling_lines import Bounds, Message, text
from hangup_contract.runtime.siblings import Answers, Channel
from hangup_contract.runtime.siblings import socket_path as channel_socket
from proxy.calls.held import Call, HeldCalls

log = logging.getLogger("hangup.proxy.siblings")

COUNT_ENV = "HANGUP_PROXY_WORKERS"  # in a worker's environment: how many workers there are
PREFIX = "cancel"  # the sockets' names: cancel-<slot>.sock
NOT_RUNNING = "not_running"  # what a worker that is not there (restarting) answers, in effect
ANSWER_BYTES = 64 * 1024
"""A worker's part of a group cancel or a listing, as JSON: the entries past it are counted."""
BOUNDS = Bounds(answer=2 * ANSWER_BYTES)
"""The channel's bounds: a question's line as every side's, an answer's what a fitted answer
needs (not the gateway's 64 MiB: a worker's asking end holds no more than this of a line)."""


def socket_path(directory: Path, slot: int) -> Path:
    return channel_socket(directory, PREFIX, slot)


def fitted(entries: list[dict[str, object]]) -> Message:
    """``entries`` as one answer: ``{"entries": [...], "more": N}``, as many as fit in
    :data:`ANSWER_BYTES` (the first ones), ``more`` counting the rest."""
    kept = len(entries)
    while True:
        answer: Message = {"entries": entries[:kept], "more": len(entries) - kept}
        if len(json.dumps(answer)) <= ANSWER_BYTES or kept == 0:
            return answer
        kept = kept * 3 // 4


def unfitted(answer: Message | None) -> tuple[list[dict[str, object]], int]:
    """A fitted answer's entries and how many more there were (none for an answer that is no
    such answer: a worker not running, or not answering)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("entries"), list):
        return [], 0
    more = answer.get("more")
    entries = [e for e in answer["entries"] if isinstance(e, dict)]
    return entries, more if type(more) is int else 0


class Siblings:
    """This worker's socket, and its questions to the other workers (the module docstring).
    ``held``: what this worker holds (what it answers)."""

    def __init__(
        self, directory: Path, slot: int, count: int, held: HeldCalls, wait: float = 2.0
    ) -> None:
        self.held = held
        self.channel = Channel(directory, PREFIX, slot, count, wait=wait, log=log, bounds=BOUNDS)
        self.listing: Callable[[str | None], list[dict[str, object]]] = lambda group: []
        """What this worker answers ``list`` with (``ServerState.listing``, set by the server)."""
        self.channel.on("held", self._on_held)
        self.channel.on("bury", self._on_bury)
        self.channel.on("unbury", self._on_unbury)
        self.channel.on("list", lambda message: fitted(self.listing(text(message, "id") or None)))
        self.channel.on_awaited("cancel", self._on_cancel)
        self.channel.on_awaited("cancel_group", self._on_cancel_group)

    async def start(self) -> None:
        await self.channel.listen()

    async def close(self) -> None:
        await self.channel.close()

    async def ask(self, op: str, request_id: str) -> list[str | None]:
        """Every other worker's answer to ``op`` (``cancel``, ``held``, ``bury``) on
        ``request_id``: its state, ``NOT_RUNNING`` for one that is not there, None for one that
        did not answer in time (or garbled; logged)."""
        return _states(await self.channel.ask_all(op, {"id": request_id}), self.channel)

    async def entries(self, op: str, key: str) -> tuple[list[dict[str, object]], int]:
        """Every other worker's entries for ``op`` (``cancel_group``, ``list``) on ``key``, and
        how many more there were than their answers held."""
        answers = await self.channel.ask_all(op, {"id": key})
        found: list[dict[str, object]] = []
        more = 0
        for answer in answers.answered.values():
            theirs, left = unfitted(answer)
            found.extend(theirs)
            more += left
        return found, more

    def tell(self, op: str, request_id: str) -> None:
        """``op`` to every other worker, as a notice (nothing answers it)."""
        self.channel.tell_all(op, {"id": request_id})

    def _on_held(self, message: Message) -> Message:
        return {"state": "held" if self.held.holds(text(message, "id")) else "free"}

    def _on_bury(self, message: Message) -> Message:
        self.held.bury(text(message, "id"))
        return {"state": "buried"}

    def _on_unbury(self, message: Message) -> Message:
        self.held.unbury(text(message, "id"))
        return {"state": "unburied"}

    async def _on_cancel(self, message: Message) -> Message:
        return {"state": await self.held.cancel(text(message, "id")) or "not_held"}

    async def _on_cancel_group(self, message: Message) -> Message:
        ended = await self.held.cancel_group(text(message, "id"))
        return fitted([group_entry(call, state) for call, state in ended])


def _states(answers: Answers, channel: Channel) -> list[str | None]:
    """Each other worker's state, in slot order (see :meth:`Siblings.ask`)."""
    states: list[str | None] = []
    for slot in channel.siblings:
        answer = answers.answered.get(slot)
        if answer is not None:
            state = answer.get("state")
            states.append(state if isinstance(state, str) else None)
        else:
            states.append(NOT_RUNNING if slot in answers.not_running else None)
    return states


def group_entry(call: Call, state: str) -> dict[str, object]:
    """A group cancel's entry for one call held here: its id upstream (echoed to its client),
    what happened to it, and the client's own id when the call is held under it too."""
    entry: dict[str, object] = {"request_id": call.request_id, "state": state}
    if call.client_request_id is not None and call.client_request_id != call.request_id:
        entry["client_request_id"] = call.client_request_id
    return entry
