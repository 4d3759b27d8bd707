"""Files a process reads at start or writes once serving.

- The ready file: one JSON object naming each listener as ``"host:port"``, written atomically
  once the process serves (a reader never sees half of it), so scripts and tests wait for it
  instead of sleeping.
- A secret file (the cancel token): its content, stripped; a missing, unreadable or empty file is
  a ``ConfigError`` naming the flag.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from hangup_contract.runtime.options import ConfigError


def write_ready_file(path: Path, listeners: Mapping[str, str | None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(listeners)))
    os.replace(tmp, path)


def read_secret(path: Path, flag: str) -> str:
    """The secret in ``path``. Raises ConfigError naming ``flag`` when it cannot be used."""
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror}") from exc
    if not secret:
        raise ConfigError(f"{flag} {path} is empty")
    return secret
