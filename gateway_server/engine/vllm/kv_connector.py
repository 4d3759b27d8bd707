"""hangup's KV connector for vLLM: a prefill worker saves a call's prompt KV to the handoff
store (:mod:`.kv_handoff`), the decode worker loads it from there, keyed by the call.

vLLM loads this module inside each engine core, through ``kv_transfer_config``
(``kv_connector="HangupHandoffConnector"``, ``kv_connector_module_path`` naming this module,
``kv_connector_extra_config={"handoff_dir": ...}``; see :mod:`.pd`). A request takes part
through its ``kv_transfer_params`` (``SamplingParams.extra_args``):
``{"hangup_handoff": KEY, "hangup_role": "save" | "load"}``. Requests without them run as usual.

How it works
------------
vLLM runs one connector object beside its scheduler and one beside its model runner; the
scheduler's builds, each step, the metadata that tells the runner's what to move.

- Save (the prefill leg). In the step that computes the prompt's last tokens, the runner copies
  the prompt's whole blocks (all but the last token, rounded down to whole blocks: decode must
  compute at least one token itself) out of every attention layer as vLLM hands it over
  (``save_kv_layer``), and writes them as one file when the step's forward pass ends
  (``wait_for_save``): ``KEY.kv.part``, renamed to ``KEY.kv`` once whole. The prefill request's
  own blocks are freed when it finishes, as usual: what the handoff holds is the file.
- Load (the decode leg). The scheduler asks how many prompt tokens the connector can supply
  (``get_num_new_matched_tokens``): those of the file, if the file's prompt digest matches this
  request's prompt. vLLM allocates blocks for them and the runner copies the file into them
  before the forward pass (``start_load_kv``), then deletes the file. vLLM counts these tokens
  in the request's ``num_cached_tokens``; they are not computed again.
- Deletion. Loaded: the runner deletes the file at once. Any other handoff (a cancel before
  decode loaded it, a decode that could not use it) is deleted by the gateway, which releases
  every call's handoff when the call ends, whatever ended it, and says in the cancel answer
  what that freed (:meth:`.kv_handoff.HandoffStore.discard`). A prompt with no whole block
  to hand over writes no file (decode computes it).

Nothing here may raise into vLLM's engine loop for a request's sake (the engine core would die
with it): a handoff that cannot be read is a miss (the decode worker computes the prompt), one
that cannot be loaded is reported as a load error (vLLM recomputes those blocks: the P/D
engine sets ``kv_load_failure_policy`` to ``recompute``).

Writing and loading happen inside an engine step, which waits for them: one that takes longer
than ``SLOW_FILE_S`` is logged (a disk stalled under other writes would otherwise show only as a
request that took seconds more than its neighbours).

Not handled: with asynchronous scheduling (vLLM turns it off on CPUs), an abort can be applied
while the step that writes a prefill's file is still running, and the file then appears after
the gateway deleted it. On GPUs, disaggregated workers take NIXL (``--kv-connector``).

The module imports vLLM and torch at import time: only vLLM's processes import it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

from gateway_server.engine.vllm.kv_handoff import (
    KEY_PATTERN,
    LOAD,
    META_BLOCK_SIZE,
    META_TOKENS,
    PARAM_KEY,
    PARAM_ROLE,
    PARTIAL,
    SAVE,
    SUFFIX,
    read_meta,
)

_base: Any = import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
_torch: Any = import_module("torch")
_safetensors: Any = import_module("safetensors.torch")

log = logging.getLogger("hangup.gateway.kv_connector")

META_DIGEST = "prompt_digest"
SLOW_FILE_S = 0.25
"""A handoff file written or loaded slower than this is logged: the engine's whole step waits
for it (a disk stalled under other writes, a store on a network file system)."""


def prompt_digest(token_ids: list[int]) -> str:
    """What ties a handoff to its prompt: a decode request loads only a file whose digest is
    that of its own first tokens."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class _SaveJob:
    key: str
    block_ids: list[int]
    tokens: int
    digest: str


@dataclass(frozen=True, slots=True)
class _LoadJob:
    key: str
    block_ids: list[int]
    """The request's blocks to fill, in order."""
    first_block: int
    """Which of the file's blocks goes into ``block_ids[0]`` (blocks the request found in its
    own prefix cache are not loaded again)."""


@dataclass
class HandoffMetadata(_base.KVConnectorMetadata):  # type: ignore[misc]  # vLLM's base (Any)
    """What the scheduler's connector tells the runner's for one step."""

    saves: list[_SaveJob] = field(default_factory=list)
    loads: list[_LoadJob] = field(default_factory=list)


@dataclass
class _Saving:
    """A prefill request whose prompt is still being computed (chunk by chunk)."""

    key: str
    prompt: list[int]
    block_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Part:
    role: str
    key: str


class HangupHandoffConnector(_base.KVConnectorBase_V1):  # type: ignore[misc]  # vLLM's (Any)
    """A file-based KV handoff between two engines on one machine, keyed by call."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        root = self._kv_transfer_config.get_from_extra_config("handoff_dir", None)
        if not root:
            raise ValueError("HangupHandoffConnector needs kv_connector_extra_config.handoff_dir")
        self._root = Path(root)
        self._block_size = int(vllm_config.cache_config.block_size)
        # Scheduler side.
        self._parts: dict[str, _Part] = {}
        self._saving: dict[str, _Saving] = {}
        self._to_load: dict[str, tuple[str, int, int]] = {}
        # Runner side.
        self._copied: dict[str, dict[str, Any]] = {}
        self._load_errors: set[int] = set()

    # -- scheduler side --------------------------------------------------------------------

    def on_new_request(self, request: Any) -> None:
        params = request.kv_transfer_params or {}
        key, role = params.get(PARAM_KEY), params.get(PARAM_ROLE)
        if key is None and role is None:
            return
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key) or role not in (SAVE, LOAD):
            log.warning("request %s: ignoring handoff parameters %r", request.request_id, params)
            return
        self._parts[request.request_id] = _Part(role, key)

    def _loadable(self, request: Any) -> tuple[str, int] | None:
        """The handoff key and how many prompt tokens its file can supply this request."""
        part = self._parts.get(request.request_id)
        if part is None or part.role != LOAD:
            return None
        meta = read_meta(self._root / (part.key + SUFFIX))
        try:
            tokens = int(meta[META_TOKENS])
            same_blocks = int(meta[META_BLOCK_SIZE]) == self._block_size
        except (KeyError, ValueError):
            return None
        prompt = list(request.prompt_token_ids or [])
        tokens = min(tokens, (len(prompt) - 1) // self._block_size * self._block_size)
        if tokens <= 0 or not same_blocks:
            return None
        if meta.get(META_DIGEST) != prompt_digest(prompt[: int(meta[META_TOKENS])]):
            log.warning("request %s: handoff %s is another prompt's", request.request_id, part.key)
            return None
        return part.key, tokens

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        found = self._loadable(request)
        if found is None:
            return 0, False
        return max(found[1] - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        found = self._loadable(request) if num_external_tokens > 0 else None
        if found is not None:
            key, tokens = found
            first = (tokens - num_external_tokens) // self._block_size
            self._to_load[request.request_id] = (key, first, tokens // self._block_size)

    def build_connector_meta(self, scheduler_output: Any) -> HandoffMetadata:
        meta = HandoffMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            rid, blocks = new.req_id, list(new.block_ids[0])
            if rid in self._to_load:
                key, first, last = self._to_load.pop(rid)
                meta.loads.append(_LoadJob(key, blocks[first:last], first))
            part = self._parts.get(rid)
            if part is not None and part.role == SAVE:
                self._saving[rid] = _Saving(part.key, list(new.prompt_token_ids or []), blocks)
                self._save_when_done(meta, rid, new.num_computed_tokens + scheduled.get(rid, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            more = cached.new_block_ids[i]
            if rid in self._to_load and more:  # resumed after a preemption: all its blocks
                key, first, last = self._to_load.pop(rid)
                meta.loads.append(_LoadJob(key, list(more[0])[first:last], first))
            saving = self._saving.get(rid)
            if saving is None:
                continue
            if rid in cached.resumed_req_ids:
                saving.block_ids = list(more[0]) if more else []
            elif more is not None:
                saving.block_ids.extend(more[0])
            self._save_when_done(meta, rid, cached.num_computed_tokens[i] + scheduled.get(rid, 0))
        self._to_load.clear()  # a load not scheduled in the step that allocated it: recomputed
        return meta

    def _save_when_done(self, meta: HandoffMetadata, rid: str, computed_after: int) -> None:
        saving = self._saving[rid]
        if computed_after < len(saving.prompt):
            return
        del self._saving[rid]
        blocks = (len(saving.prompt) - 1) // self._block_size
        if blocks == 0:
            return  # nothing whole to hand over: decode computes the prompt
        tokens = blocks * self._block_size
        digest = prompt_digest(saving.prompt[:tokens])
        meta.saves.append(_SaveJob(saving.key, saving.block_ids[:blocks], tokens, digest))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        # The request's own blocks are free at once (False): a handoff is a file, not blocks.
        self._parts.pop(request.request_id, None)
        self._saving.pop(request.request_id, None)
        self._to_load.pop(request.request_id, None)
        return False, None

    # -- runner side -----------------------------------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for job in meta.loads:
            path = self._root / (job.key + SUFFIX)
            started = time.monotonic()
            try:
                saved = _safetensors.load_file(str(path))
                self._inject(forward_context, job, saved)
            except Exception:  # a file gone or damaged: vLLM recomputes these blocks
                log.exception("handoff %s could not be loaded", job.key)
                self._load_errors.update(job.block_ids)
            finally:
                self._delete(job.key)
            _warn_if_slow("loading", job.key, started)

    def _inject(self, forward_context: Any, job: _LoadJob, saved: dict[str, Any]) -> None:
        ids = _torch.tensor(job.block_ids, dtype=_torch.long)
        last = job.first_block + len(job.block_ids)
        for name, layer in forward_context.no_compile_layers.items():
            cache = getattr(layer, "kv_cache", None)
            if cache is None:
                continue
            if name not in saved:
                raise KeyError(f"layer {name} is not in the handoff")
            cache[ids.to(cache.device)] = saved[name][job.first_block : last].to(cache.device)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are done before the forward pass starts

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        for job in self._get_connector_metadata().saves:
            ids = _torch.tensor(job.block_ids, dtype=_torch.long, device=kv_layer.device)
            self._copied.setdefault(job.key, {})[layer_name] = kv_layer[ids].detach().cpu()

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        for job in meta.saves:
            layers = self._copied.pop(job.key, None)
            if not layers:
                log.warning("handoff %s: vLLM handed over no attention layer", job.key)
                continue
            self._write(job, layers)
        self._copied.clear()

    def _write(self, job: _SaveJob, layers: dict[str, Any]) -> None:
        path = self._root / (job.key + SUFFIX)
        partial = self._root / (job.key + PARTIAL)
        info = {
            META_TOKENS: str(job.tokens),
            META_BLOCK_SIZE: str(self._block_size),
            META_DIGEST: job.digest,
        }
        started = time.monotonic()
        try:
            tensors = {name: t.contiguous() for name, t in layers.items()}
            _safetensors.save_file(tensors, str(partial), metadata=info)
            os.replace(partial, path)
        except Exception:  # a full disk: decode computes the prompt itself
            log.exception("handoff %s could not be written", job.key)
            with contextlib.suppress(OSError):
                partial.unlink()
        _warn_if_slow("writing", job.key, started)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # -- both ------------------------------------------------------------------------------

    def _delete(self, key: str) -> None:
        for name in (key + SUFFIX, key + PARTIAL):
            with contextlib.suppress(FileNotFoundError):
                (self._root / name).unlink()


def _warn_if_slow(doing: str, key: str, started: float) -> None:
    took = time.monotonic() - started
    if took > SLOW_FILE_S:
        log.warning("handoff %s: %s its file took %.2f s (the step waited)", key, doing, took)
