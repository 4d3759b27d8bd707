"""What the Triton and Truss tiers' servers share (``triton/``, ``truss/``): a model server
started on 127.0.0.1 (its process, its HTTP address, the directory its models record into, its
log), and reading those records.

Each model of either tier appends one JSON line per event of a request to
``<records>/<model>.jsonl`` (``triton/models/record.py``, ``truss/models/record.py``), in one
``O_APPEND`` write, so that a reader sees whole lines but for the last.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ModelServer:
    popen: subprocess.Popen[bytes]
    http: str  # host:port
    records: Path
    log_path: Path

    def url(self) -> str:
        return f"http://{self.http}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def read_records(path: Path, by: str) -> dict[Any, dict[str, Any]]:
    """The records in ``path`` by their ``by`` field, the latest line per key. A model may be
    writing a line as this reads: only lines that end are read (each is written whole with one
    ``O_APPEND`` write, so only the last can be cut short)."""
    if not path.exists():
        return {}
    text = path.read_text()
    lines = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]
    return {line[by]: line for line in lines}
