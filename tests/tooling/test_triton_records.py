"""Reading the Triton and Truss tiers' records (``bench/harness/model_servers.py``) while a model
writes them: a line still being written is not read yet (it was a JSONDecodeError in a full run,
with sixteen model threads writing as the test polled)."""

from __future__ import annotations

from pathlib import Path

from bench.harness.model_servers import read_records


def test_a_line_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    done = '{"id": "a", "how": "cancelled"}\n'
    path.write_text(done + '{"id": "b", "how": "canc')
    assert read_records(path, "id") == {"a": {"id": "a", "how": "cancelled"}}
    path.write_text(done + '{"id": "b", "how": "cancelled"}\n')
    assert set(read_records(path, "id")) == {"a", "b"}
