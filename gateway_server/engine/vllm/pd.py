"""The vLLM engine for disaggregated prefill/decode: :class:`VllmPdEngine`, one per worker, both
legs of :class:`~.handoff.DisaggregatedEngine` on a vLLM ``AsyncLLM`` with a KV connector.

How it works
------------
Every worker of a P/D gateway runs vLLM with a KV connector (``kv_role`` ``kv_both``: any
worker can serve either leg). With ``--kv-connector hangup`` (the default) that is hangup's
own connector (:mod:`.kv_connector`) over one handoff store per gateway (:mod:`.kv_handoff`, a
temporary directory every worker of the gateway shares, deleted when the gateway stops):

- ``prefill``: the request with ``max_tokens`` 1 and ``kv_transfer_params`` "save under the
  call's key". vLLM computes the prompt, the connector writes its whole blocks to the store in
  that step, and the request finishes: the prefill worker's own KV blocks are free at once,
  the handoff is the file. The token it sampled is dropped (decode samples it again, from the
  same KV).
- ``decode``: the whole request with "load the call's key". The connector supplies the saved
  blocks (vLLM counts them in the output's ``num_cached_tokens``, not computed again), decode
  computes the prompt's rest and generates. ``phase`` answers ``TRANSFER`` until its first
  token (loading is part of the step that computes that token), ``DECODE`` after.
- ``release``: deletes the call's file (what the handoff held on the prefill side), and answers
  the blocks it held; the connector itself deletes it as soon as decode has loaded it. The
  gateway releases every call's handoff when the call ends, so a cancel in ``transfer`` (the
  decode leg aborted before it loaded the KV) frees the file and reports its blocks.

Aborting a leg is the vLLM engine's ``abort`` (it returns once the engine core applied it:
a decode leg aborted before it was scheduled has allocated nothing; one aborted after has had
its blocks freed, and its handoff file deleted, by then).

``--kv-connector NixlConnector`` (GPUs) sets vLLM's NIXL connector instead: the prefill leg
asks for a remote decode (``do_remote_decode``), the decode leg carries the prefill output's
``kv_transfer_params``. The prefill worker then keeps the blocks until decode pulls them or
NIXL's lease runs out: ``release`` cannot free them sooner (vLLM has no call for it) and
answers 0. That path is not exercised on this machine (no GPU, no NIXL).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from importlib import import_module
from typing import Any

from gateway_server.engine.base import EngineError, EngineRequest, FinishReason, TokenChunk
from gateway_server.engine.context import EngineContext
from gateway_server.engine.handoff import KvHandoff
from gateway_server.engine.vllm.engine import VllmEngine
from gateway_server.engine.vllm.factory import vllm_engine_factory
from gateway_server.engine.vllm.ipc import IpcDirectory
from gateway_server.engine.vllm.kv_handoff import (
    LOAD,
    SAVE,
    HandoffStore,
    handoff_key,
    transfer_params,
)
from gateway_server.engine.vllm.options import VllmOptions
from hangup_contract.cancel_labels import Phase

HANGUP_CONNECTOR = "hangup"
NIXL_CONNECTOR = "NixlConnector"
KV_CONNECTORS = (HANGUP_CONNECTOR, NIXL_CONNECTOR)
"""``--kv-connector``'s values."""


def kv_transfer_config(connector: str, store: HandoffStore) -> Any:
    """vLLM's ``KVTransferConfig`` for a P/D worker with ``connector``."""
    config: Any = import_module("vllm.config")
    if connector == NIXL_CONNECTOR:
        return config.KVTransferConfig(kv_connector=NIXL_CONNECTOR, kv_role="kv_both")
    return config.KVTransferConfig(
        kv_connector="HangupHandoffConnector",
        kv_connector_module_path="gateway_server.engine.vllm.kv_connector",
        kv_role="kv_both",
        kv_connector_extra_config={"handoff_dir": str(store.root)},
        kv_load_failure_policy="recompute",  # a handoff that cannot be loaded is recomputed
    )


class VllmPdEngine(VllmEngine):
    """A vLLM worker that serves either leg of a disaggregated call (and whole requests)."""

    def __init__(
        self, model: str, options: VllmOptions, store: HandoffStore, **kwargs: Any
    ) -> None:
        super().__init__(model, options, **kwargs)
        self.store = store
        self.connector = options.kv_connector
        self._params: dict[str, Mapping[str, Any]] = {}
        """``kv_transfer_params`` of the legs running here, by engine request id."""
        self._decoding: set[str] = set()
        self._handoffs: set[str] = set()
        """Keys of the handoffs this worker prefilled that nobody released yet."""
        self._finished_params: dict[str, Mapping[str, Any]] = {}
        """The ``kv_transfer_params`` vLLM answered at the end of a prefill leg (NIXL's)."""
        self.loaded_tokens_total = 0
        """Prompt tokens decode legs here did not compute: vLLM's ``num_cached_tokens`` (the
        connector's loads; prefix-cache hits too, where prefix caching is on)."""

    def _engine_args(self) -> dict[str, Any]:
        args = super()._engine_args()
        args["kv_transfer_config"] = kv_transfer_config(self.connector, self.store)
        return args

    def _counts_output(self, request_id: str) -> bool:
        """A prefill leg's one token is not the answer's (the decode leg's are)."""
        return not (request_id in self._params and request_id not in self._decoding)

    def _chunk(self, state: Any, out: Any) -> TokenChunk:
        rid = out.request_id
        prefilling = rid in self._params and rid not in self._decoding
        if out.finished and prefilling and out.kv_transfer_params is not None:
            self._finished_params[rid] = out.kv_transfer_params
        if rid in self._decoding and not state.output_tokens:
            self.loaded_tokens_total += int(out.num_cached_tokens or 0)
        return super()._chunk(state, out)

    def _sampling_for(self, request: EngineRequest) -> Any:
        sampling = super()._sampling_for(request)
        params = self._params.get(request.request_id)
        if params is not None:
            sampling.extra_args = {"kv_transfer_params": dict(params)}
        return sampling

    async def prefill(self, request: EngineRequest, key: str) -> KvHandoff | None:
        """See :meth:`~.handoff.DisaggregatedEngine.prefill`; ``key`` is the engine request's id."""
        file_key = handoff_key(key)
        rid = request.request_id
        if self.connector == NIXL_CONNECTOR:
            self._params[rid] = {"do_remote_decode": True, "do_remote_prefill": False}
        else:
            self._params[rid] = transfer_params(file_key, SAVE)
        one = dataclasses.replace(
            request.params,
            max_tokens=1,
            min_tokens=0,
            logprobs=None,
            prompt_logprobs=None,  # the decode leg computes them (and its whole prompt then)
            structured=None,
        )
        prompt_tokens, finish, out_params = 0, None, None
        try:
            async for chunk in self.generate(dataclasses.replace(request, params=one)):
                prompt_tokens, finish = chunk.prompt_tokens, chunk.finish_reason
        finally:
            del self._params[rid]
            out_params = self._finished_params.pop(rid, None)
        if finish is None or finish is FinishReason.ABORT:
            self.store.discard(file_key)
            return None
        self._handoffs.add(file_key)
        if self.connector == NIXL_CONNECTOR:
            transfer: Mapping[str, Any] = dict(out_params or {})
        else:
            transfer = transfer_params(file_key, LOAD)
        blocks = self.store.holding_of(file_key).blocks
        return KvHandoff(key, rid, prompt_tokens, blocks, math.inf, transfer)

    async def decode(
        self, request: EngineRequest, handoff: KvHandoff
    ) -> AsyncGenerator[TokenChunk, None]:
        """See :meth:`~.handoff.DisaggregatedEngine.decode`."""
        rid = request.request_id
        self._params[rid] = handoff.transfer_params
        self._decoding.add(rid)
        try:
            async for chunk in self.generate(request):
                yield chunk
        finally:
            self._params.pop(rid, None)
            self._decoding.discard(rid)

    async def release(self, key: str) -> int:
        """Delete what the store still holds for the call ``key``; the blocks it held."""
        file_key = handoff_key(key)
        self._handoffs.discard(file_key)
        return self.store.discard(file_key).blocks

    def kv_blocks(self, request_id: str) -> int:
        """Blocks a running leg holds, from its token counts (vLLM's scheduler does not tell
        this process); 0 for a leg not running here."""
        state = self._live.get(request_id)
        block_size = self.load().block_size
        if state is None or not block_size:
            return 0
        return -(-(state.prompt_tokens + state.output_tokens) // block_size)

    def handoff_blocks(self) -> int:
        held = 0
        for file_key in list(self._handoffs):
            blocks = self.store.holding_of(file_key)
            if blocks.empty:
                self._handoffs.discard(file_key)  # loaded (the decode side deleted it)
            held += blocks.blocks
        return held

    def phase(self, request_id: str) -> Phase | None:
        phase = super().phase(request_id)
        if request_id in self._decoding and phase is not None and phase is not Phase.DECODE:
            return Phase.TRANSFER
        return phase


def vllm_pd_engine_factory(
    model: str, options: VllmOptions, workers: int, store: HandoffStore
) -> Callable[[int], VllmPdEngine]:
    """Makes worker *i*'s :class:`VllmPdEngine`, every worker on ``store``, each with its own
    GPUs when GPUs exist (as :func:`~.factory.vllm_engine_factory`).

    Raises EngineError for an unknown ``--kv-connector``, when vLLM is not installed or there
    are too few GPUs.
    """
    if options.kv_connector not in KV_CONNECTORS:
        raise EngineError(
            f"--kv-connector {options.kv_connector!r} is not known; "
            f"expected one of: {', '.join(KV_CONNECTORS)}"
        )
    plain = vllm_engine_factory(model, options, workers)  # checks vLLM and the devices
    lock, ipc = threading.Lock(), IpcDirectory()

    def make(index: int) -> VllmPdEngine:
        devices = plain(index).devices  # a plain engine object is only settings until started
        return VllmPdEngine(
            model, options, store, index=index, devices=devices, spawn_lock=lock, ipc=ipc
        )

    return make


def pd_factory(context: EngineContext) -> Callable[[int], VllmPdEngine]:
    """The P/D engine factory of a gateway: one new handoff store for all its workers (and
    their restarts), deleted when the gateway process exits."""
    assert isinstance(context.settings, VllmOptions)
    assert context.model is not None  # --model is required with --engine vllm
    store = HandoffStore.fresh()
    atexit.register(store.remove)
    return vllm_pd_engine_factory(context.model, context.settings, context.workers, store)
