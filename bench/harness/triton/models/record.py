"""How each request ended, as the models saw it: one JSON line per request, appended to
``<record_dir>/<model>.jsonl`` (``record_dir`` is a parameter of the model's configuration,
filled in when the repository is copied for a run). Copied next to each ``model.py``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def record_dir(args: dict[str, Any]) -> Path:
    config = json.loads(args["model_config"])
    return Path(config["parameters"]["record_dir"]["string_value"])


def record(directory: Path, model: str, **fields: Any) -> None:
    line = json.dumps({"model": model, "at": time.time(), **fields}) + "\n"
    fd = os.open(directory / f"{model}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines never interleave
    finally:
        os.close(fd)
