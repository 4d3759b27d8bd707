"""The disaggregated prefill/decode seam: worker roles, the KV handoff, and what an engine that
serves one leg of a call implements.

A call served disaggregated (P/D) runs two engine requests, its *legs*, on two workers:

1. **prefill**, on a worker whose role prefills: :meth:`DisaggregatedEngine.prefill` computes
   the prompt and keeps its KV cache under a *key* (the engine request's id, derived from the
   call id: ``<call id>-<n>``, one per engine request of the call), then returns a
   :class:`KvHandoff`: where the KV is, how many blocks, until when the prefill side holds it
   (its lease), and what the decode request must carry to load it (``transfer_params``).
2. **transfer**, from the end of prefill until the decode worker holds the KV and has admitted
   the request: :meth:`DisaggregatedEngine.decode` is called on a worker whose role decodes
   with the whole request (prompt and sampling parameters) and the handoff; the engine
   allocates blocks for the prompt, loads the KV (``phase`` answers ``TRANSFER`` meanwhile);
3. **decode**: then generates, as :meth:`~.base.Engine.generate` does (``phase``: ``DECODE``).

Whoever ends the call (it completed, a cancel, a hang-up, a failure) calls
:meth:`DisaggregatedEngine.release` with the key on the prefill engine: the KV it still holds
for the call is freed (idempotent; a decode that pulled the KV normally freed it already). The
gateway never trusts a notification to do it: a lost one, an expired lease or a decode leg that
never arrived all end in the same ``release``.

Mapping to vLLM with a KV connector: ``prefill`` is the prompt with ``max_tokens`` 1 and
``kv_transfer_params`` saying "save under key X" (the output's ``kv_transfer_params`` become
the handoff's ``transfer_params``); ``decode`` is the full request with those
``kv_transfer_params`` ("load key X"); ``release`` deletes what the connector keeps for X;
aborting either leg is ``abort(request_id)``. The simulated engine implements it with its block
model (:mod:`.sim.engine`, :mod:`.sim.kv`). An engine kind whose engines implement it says so in its
row of the engine table (``EngineKind.disaggregates``); ``--worker-roles`` is refused for others.
An engine that must know its worker's role (vLLM's ``kv_role``) is told by its factory, which
gets the worker's index: ``GatewayConfig.roles[index]``. The legs' engine request ids are
``<key>-prefill`` and ``<key>-decode``.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gateway_server.engine.base import Engine, EngineError, EngineRequest, TokenChunk


class WorkerRole(enum.StrEnum):
    """What a worker serves (``--worker-roles``)."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"
    """Whole requests (aggregated serving), and either leg of a disaggregated call."""

    @property
    def prefills(self) -> bool:
        return self is not WorkerRole.DECODE

    @property
    def decodes(self) -> bool:
        return self is not WorkerRole.PREFILL


def parse_roles(text: str, workers: int) -> tuple[WorkerRole, ...]:
    """``prefill,decode,decode`` as roles, one per worker; "" means every worker ``both``.

    Raises ValueError naming the problem: an unknown role, a count other than ``workers``, no
    worker that prefills or none that decodes.
    """
    if not text.strip():
        return (WorkerRole.BOTH,) * workers
    names = [name.strip() for name in text.split(",")]
    accepted = ", ".join(WorkerRole)
    roles = []
    for name in names:
        if name not in set(WorkerRole):
            raise ValueError(f"unknown worker role {name!r}; expected one of: {accepted}")
        roles.append(WorkerRole(name))
    if len(roles) != workers:
        raise ValueError(f"{len(roles)} worker roles given for {workers} workers (--workers)")
    check_roles(roles)
    return tuple(roles)


def check_roles(roles: Sequence[WorkerRole]) -> None:
    """Raise ValueError unless some worker prefills and some worker decodes."""
    if not any(role.prefills for role in roles):
        raise ValueError("no worker can prefill: give one the role prefill or both")
    if not any(role.decodes for role in roles):
        raise ValueError("no worker can decode: give one the role decode or both")


def disaggregated(roles: Sequence[WorkerRole]) -> bool:
    """Whether calls run as two legs (some worker has a role other than ``both``)."""
    return any(role is not WorkerRole.BOTH for role in roles)


@dataclass(frozen=True, slots=True)
class KvHandoff:
    """A prompt's KV cache held by a prefill engine for a decode engine to load."""

    key: str
    """What the KV is kept under: the engine request's id (``<call id>-<n>``; one handoff per
    engine request, so a call with ``n`` > 1 has one per choice)."""
    prefill_request_id: str
    """The prefill leg's engine request id (it has ended when the handoff exists)."""
    prompt_tokens: int
    blocks: int
    """KV blocks held for the handoff on the prefill side."""
    lease_expires_at: float
    """``time.monotonic()`` when the prefill side frees the KV if nobody pulled or released it
    (``inf``: it never does on its own)."""
    transfer_params: Mapping[str, Any] = field(default_factory=dict)
    """Engine-specific: what the decode request carries to find the KV (vLLM: its
    ``kv_transfer_params``)."""


class HandoffError(EngineError):
    """A KV handoff failed: the decode side could not load the prefill's KV and could not
    recompute it either."""


@runtime_checkable
class DisaggregatedEngine(Engine, Protocol):
    """An engine that serves either leg of a disaggregated call (see the module docstring).

    Both legs are engine requests: ``abort(request_id)`` stops either, idempotently, with the
    same contract as for ``generate`` (returns once the engine stopped and freed what the
    request held, blocks allocated for a transfer included); ``phase(request_id)`` reports them.
    """

    async def prefill(self, request: EngineRequest, key: str) -> KvHandoff | None:
        """Compute ``request``'s prompt and keep its KV under ``key``; return the handoff once
        the KV is held, or None when the request was aborted first (nothing is kept then).

        The engine holds the KV until :meth:`release`, a decode that pulls it, or the lease.
        Raises :class:`~.base.EngineError` (:class:`~.base.EngineDead`) as ``generate`` does.
        """
        ...

    def decode(
        self, request: EngineRequest, handoff: KvHandoff
    ) -> AsyncGenerator[TokenChunk, None]:
        """Generate ``request`` with its prompt's KV loaded from ``handoff``: chunks as from
        ``generate`` (an abort ends with ``ABORT``). ``phase`` is ``TRANSFER`` until the KV is
        loaded and the request admitted. KV that cannot be loaded (released, lease expired) is
        recomputed, or :class:`HandoffError` is raised."""
        ...

    async def release(self, key: str) -> int:
        """Free the KV this engine still holds under ``key`` (a handoff's, or a prefill's that
        ended as it was aborted); returns the blocks freed (0 when it held none: pulled,
        released or expired already). Idempotent, never raises; works on a dead engine."""
        ...

    def kv_blocks(self, request_id: str) -> int:
        """KV blocks the engine holds for engine request ``request_id`` now (0: none, or not
        known); what a cancel answer reports as freed."""
        ...

    def handoff_blocks(self) -> int:
        """KV blocks this engine holds for handoffs nobody has pulled or released yet."""
        ...
