"""A pytest plugin: a test that leaves this process's environment changed fails, naming what it
changed. Every server a later test starts inherits the environment, so a variable left behind
breaks tests far from the one that set it (a ``VLLM_RPC_BASE_PATH`` naming a directory since
removed made Triton's vLLM model fail to load, 107 errors later in the run). ``monkeypatch``
restores what it changed; code under test that sets a variable itself needs the variable
recorded first (``monkeypatch.setenv`` then ``monkeypatch.delenv``: ``delenv`` of a variable that
is not set records nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_PYTESTS_OWN = "PYTEST_CURRENT_TEST"  # pytest sets it for each phase of each test


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    # Autouse, so set up before the test's other fixtures and finalized after them: what their
    # teardown restores counts as restored.
    before = {k: v for k, v in os.environ.items() if k != _PYTESTS_OWN}
    yield
    after = {k: v for k, v in os.environ.items() if k != _PYTESTS_OWN}
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        told = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed)
        pytest.fail(f"the test left the environment changed ({told})", pytrace=False)
