"""The handoff store: where a prefill worker leaves a call's KV cache for the decode worker.

How it works
------------
A directory the gateway owns (one per gateway process). hangup's KV connector
(:mod:`.kv_connector`, loaded by vLLM inside each engine core) writes one file per call: the KV
of the prompt's whole blocks, every attention layer, in safetensors format, named by the call's
handoff key (:func:`handoff_key`). It is written as ``KEY.kv.part`` and renamed to ``KEY.kv``
once complete, so a ``.kv`` file is always whole. The decode worker's connector loads it and
deletes it; a decode request that ends without loading it (too short a prompt, an abort)
deletes it too, and the gateway deletes it when a call is cancelled (:meth:`HandoffStore.discard`).

This module is the part the gateway process uses: paths, counting what the store holds
(handoffs, files, blocks, bytes, read from the files themselves, so the count is the truth even
for what an engine core wrote) and discarding. It imports neither vLLM nor torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".kv"
PARTIAL = ".kv.part"
KEY_PATTERN = re.compile(r"[0-9a-f]{32}")
"""What a handoff key looks like (:func:`handoff_key`); the connector ignores any other."""
META_TOKENS = "tokens"
META_BLOCK_SIZE = "block_size"
PARAM_KEY = "hangup_handoff"
PARAM_ROLE = "hangup_role"
SAVE = "save"
LOAD = "load"


def transfer_params(key: str, role: str) -> dict[str, str]:
    """The ``kv_transfer_params`` that make a request save (``SAVE``, the prefill leg) or load
    (``LOAD``, the decode leg) the handoff ``key`` (hangup's connector reads them)."""
    return {PARAM_KEY: key, PARAM_ROLE: role}


def handoff_key(call_id: str) -> str:
    """The handoff key of a call: a file name derived from its id (any text a client sent)."""
    return hashlib.sha256(call_id.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class HandoffHoldings:
    """What a handoff store holds (or what one discard removed)."""

    handoffs: int = 0
    """Complete handoffs waiting for a decode worker."""
    files: int = 0
    """Files, partial ones (a prefill writing) included."""
    blocks: int = 0
    """KV blocks in the complete handoffs."""
    bytes: int = 0

    def __add__(self, other: HandoffHoldings) -> HandoffHoldings:
        return HandoffHoldings(
            self.handoffs + other.handoffs,
            self.files + other.files,
            self.blocks + other.blocks,
            self.bytes + other.bytes,
        )

    @property
    def empty(self) -> bool:
        return self.files == 0


def read_meta(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (its header only); {} when unreadable."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}


def file_blocks(path: Path) -> int:
    """KV blocks a complete handoff file holds (0 when its header says nothing)."""
    meta = read_meta(path)
    try:
        return int(meta[META_TOKENS]) // max(int(meta[META_BLOCK_SIZE]), 1)
    except (KeyError, ValueError):
        return 0


class HandoffStore:
    """A directory of handoff files. Safe to use from any process; no state but the files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def fresh(cls) -> HandoffStore:
        """A new, empty store in a temporary directory of its own (:meth:`remove` deletes it)."""
        return cls(Path(tempfile.mkdtemp(prefix="hangup-kv-handoff-")))

    def path(self, key: str) -> Path:
        return self.root / (key + SUFFIX)

    def holding(self) -> HandoffHoldings:
        """What the store holds now (scans the directory: a few files, cheap)."""
        held = HandoffHoldings()
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return held
        for entry in entries:
            held += self._measure(entry)
        return held

    def holding_of(self, key: str) -> HandoffHoldings:
        """What the store holds for one handoff key."""
        return self._measure(self.path(key)) + self._measure(self.root / (key + PARTIAL))

    def discard(self, key: str) -> HandoffHoldings:
        """Delete a call's handoff (complete or partial); what was removed. Idempotent.

        Call it once the legs that could still write or read the file are aborted: a prefill
        still running could write the file again afterwards.
        """
        removed = HandoffHoldings()
        for path in (self.path(key), self.root / (key + PARTIAL)):
            measured = self._measure(path)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed += measured
        return removed

    def remove(self) -> None:
        """Delete the store's directory and everything in it (at shutdown)."""
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _measure(path: Path) -> HandoffHoldings:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return HandoffHoldings()
        if path.name.endswith(PARTIAL):
            return HandoffHoldings(0, 1, 0, size)
        if path.name.endswith(SUFFIX):
            return HandoffHoldings(1, 1, file_blocks(path), size)
        return HandoffHoldings()
