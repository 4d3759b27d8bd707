"""A vLLM plugin that asks Linux for AMX in every vLLM process, before any kernel runs.

On x86-64 CPUs with AMX (Intel Sapphire Rapids and later), Linux lets a process use AMX's tile
registers only once it has asked (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a
process that uses them unasked dies of SIGILL. vLLM-CPU's attention kernel
(``cpu_attention_with_kv_cache``) takes its AMX path whenever the CPU has AMX, and vLLM never
asks: whether a worker had permission depended on whether something else (oneDNN, for one of
its own matmuls) had asked first. On a CPU with AMX, the first request of a fresh engine, a
three-token prompt, killed the engine's worker with ``Fatal Python error: Illegal instruction``
in that kernel, every time (8 of 8 fresh engines here, 3 of them the first request of a full
test run; the gateway then started the engine again, and the request failed); asking at start,
0 of 3.

vLLM runs the functions of its ``vllm.general_plugins`` entry points in every process it starts
(API process, engine cores, workers) before any model code: hangup's distribution names
:func:`allow_amx` there (``pyproject.toml``), so it runs for ``vllm serve`` in the same
environment too, where it does the same good. ``VLLM_PLUGINS``, if set, must name
``hangup_allow_amx`` to keep it. Where there is no AMX, or no Linux, the request is refused or
not made, and nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys
from pathlib import Path

log = logging.getLogger("hangup.gateway.vllm")

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def allow_amx() -> bool:
    """Ask for AMX tile permission for this process; True when granted (now or before).
    Idempotent; never raises. A CPU that has AMX yet is refused is logged (vLLM's AMX kernels
    will then fail in this process)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        granted = bool(
            libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
        )
        errno = ctypes.get_errno()
    except (OSError, AttributeError):
        return False
    if not granted and _cpu_has_amx():
        log.warning("AMX permission refused (errno %d): vLLM's AMX kernels will fail", errno)
    return granted


def _cpu_has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
