"""The output of an engine's processes: passed on unchanged, and its last error line kept for the
death log (what vLLM's engine core printed before it died;
``gateway_server/engine/vllm/output_tail.py``).
A real child process, started while the tail captures, prints after the capture has ended, as a
vLLM engine core does for its whole life."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.base.waiting import poll_until
from gateway_server.engine.vllm.output_tail import OutputTail, error_line

CHILD = r"""
import sys
sys.stdin.readline()
print("ValueError: an uncaught one on stderr", file=sys.stderr, flush=True)
sys.stdin.readline()
print("(EngineCore pid=7) INFO 11-24 23:53:35 [core.py:90] serving", flush=True)
print("(EngineCore pid=7) ERROR 11-24 23:53:35 [core.py:1512] Traceback (most recent call last):")
print("(EngineCore pid=7) ERROR 11-24 23:53:35 [core.py:1512] RuntimeError: Worker failed: boom")
print("(EngineCore pid=7) INFO 11-24 23:53:35 [core.py:99] shutting down", flush=True)
"""


def test_a_process_started_while_capturing_is_passed_on_and_its_last_error_kept(
    capfd: pytest.CaptureFixture[str],
) -> None:
    tail = OutputTail()
    with tail.capture():
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE)
        print("the gateway's own line, written while capturing", flush=True)
    tail.forget()  # ready: what came before is not the engine's death
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.flush()
    # stdout and stderr are two pipes, read apart: the child goes on only once the stderr line
    # is seen, so which error is the latest is known.
    poll_until(
        lambda: tail.last_error() == "ValueError: an uncaught one on stderr",
        within=10,
        what="the stderr error line kept",
    )
    child.stdin.write(b"go\n")
    child.stdin.close()
    assert child.wait(30) == 0
    tail.close()
    out, err = capfd.readouterr()
    assert "[core.py:1512] RuntimeError: Worker failed: boom\n" in out  # passed on, unchanged
    assert "the gateway's own line" in out and "shutting down" in out
    assert err == "ValueError: an uncaught one on stderr\n"
    assert tail.last_error() == "RuntimeError: Worker failed: boom"
    print("after the capture", flush=True)  # this process's output is its own again
    assert capfd.readouterr().out == "after the capture\n"


def test_nothing_printed_means_no_error_line() -> None:
    tail = OutputTail()
    with tail.capture():
        pass
    tail.close()
    assert tail.last_error() == ""


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            "(EngineCore_DP0 pid=9) ERROR 11-24 23:53:35 [core.py:1512] RuntimeError: CPU oops",
            "RuntimeError: CPU oops",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        ("KeyboardInterrupt", "KeyboardInterrupt"),
        ("(Worker pid=3) INFO 11-24 23:53:35 [gpu_worker.py:1] Error rate is 0", None),
        ('{"level": "error", "msg": "engine_worker_died"}', None),
        ('  File "core.py", line 1, in run', None),
    ],
)
def test_an_error_line_is_a_tracebacks_last_line(line: str, error: str | None) -> None:
    assert error_line(line) == error
