"""The handoff store as the gateway sees it: keys that are safe file names, counts read from the
files themselves (what an engine core wrote), discards that say what they removed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from gateway_server.engine.vllm.kv_handoff import (
    KEY_PATTERN,
    HandoffHoldings,
    HandoffStore,
    handoff_key,
)


def write_handoff(path: Path, tokens: int, block_size: int, payload: bytes = b"\0" * 64) -> None:
    """A file laid out as safetensors writes one: header length, JSON header, data."""
    header = {
        "__metadata__": {"tokens": str(tokens), "block_size": str(block_size)},
        "layer.0": {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]},
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)


def test_keys_are_file_names_whatever_the_call_id() -> None:
    for call_id in ("abc", "../../etc/passwd", "ü spaces\n", "x" * 500):
        key = handoff_key(call_id)
        assert KEY_PATTERN.fullmatch(key), key
    assert handoff_key("a") != handoff_key("b")
    assert handoff_key("a") == handoff_key("a")


def test_holding_counts_complete_and_partial_handoffs(tmp_path: Path) -> None:
    store = HandoffStore(tmp_path)
    assert store.holding() == HandoffHoldings() and store.holding().empty
    write_handoff(store.path(handoff_key("one")), tokens=384, block_size=128)
    write_handoff(store.path(handoff_key("two")), tokens=128, block_size=128)
    (tmp_path / (handoff_key("three") + ".kv.part")).write_bytes(b"partial")
    held = store.holding()
    assert (held.handoffs, held.files, held.blocks) == (2, 3, 4)
    assert held.bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert store.holding_of(handoff_key("one")).blocks == 3


def test_discard_removes_one_call_and_says_what(tmp_path: Path) -> None:
    store = HandoffStore(tmp_path)
    write_handoff(store.path(handoff_key("one")), tokens=256, block_size=128)
    write_handoff(store.path(handoff_key("two")), tokens=128, block_size=128)
    removed = store.discard(handoff_key("one"))
    assert (removed.handoffs, removed.files, removed.blocks) == (1, 1, 2)
    assert store.discard(handoff_key("one")) == HandoffHoldings()  # idempotent
    assert store.holding().blocks == 1


def test_a_fresh_store_is_its_own_directory_and_remove_deletes_it() -> None:
    store = HandoffStore.fresh()
    try:
        write_handoff(store.path(handoff_key("x")), tokens=128, block_size=128)
        assert store.holding().handoffs == 1
    finally:
        store.remove()
    assert not store.root.exists()
    assert store.holding().empty
