"""An engine request's books: what the service keeps of it while it runs, and what it consumed
once it ended (tokens, and seconds in each phase).

Where the seconds come from (``time.perf_counter()`` throughout): the service marks when the
request began (it entered its engine's queue) and when its first token arrived (``decode``
from then on); its engines mark when it left the waiting queue (``prefill`` from then on;
``Consumption.admitted_at``, as the engine's own ``phase`` tells ``queued`` from ``prefill``)
and, served split, when its prefill leg ended with the prompt's KV held (``transfer`` until
the decode leg's first token; ``Consumption.prefilled_at``). A request never admitted spent
all its time queued. The marks are taken in that order of phases, each no earlier than the one
before and no later than the end, so the seconds of a request add up to its duration.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway_server.engine.base import Consumption
from gateway_server.labels import Outcome
from gateway_server.metrics.token_books import TokenBooks
from hangup_contract.cancel_labels import Phase


@dataclass(slots=True)
class Books:
    """One engine request's books while ``GenerationService.generate`` runs it."""

    started: float
    tally: TokenBooks
    first_token_at: float | None = None
    last_token_at: float | None = None
    prompt_tokens: int = 0
    """As its chunks said (the engine's ``Consumption`` may know it before any chunk)."""
    outcome: Outcome = Outcome.ERROR
    cancelled: BaseException | None = None
    """The ``RequestCancelled`` it ended with, if one: its ``usage`` is filled in at the end."""


def phase_seconds(
    started: float, ended: float, consumed: Consumption, first_token_at: float | None
) -> dict[Phase, float]:
    """Seconds the request spent in each phase it reached, from ``started`` to ``ended`` (see
    the module docstring); phases it never reached are left out."""
    marks = [(Phase.QUEUED, started)]
    for phase, at in (
        (Phase.PREFILL, consumed.admitted_at),
        (Phase.TRANSFER, consumed.prefilled_at),
        (Phase.DECODE, first_token_at),
    ):
        if at is not None:
            marks.append((phase, min(max(at, marks[-1][1]), ended)))
    seconds = {}
    for (phase, at), (_, until) in zip(marks, [*marks[1:], (None, ended)], strict=True):
        seconds[phase] = max(until - at, 0.0)
    return seconds
