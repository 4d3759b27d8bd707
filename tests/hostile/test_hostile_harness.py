"""The hostile tier's own checks can fail: a quadratic parse breaks the budget, a blocked loop
trips the armed watchdog."""

from __future__ import annotations

import asyncio
import sys
import time
from types import FrameType
from typing import Any

import pytest

from bench.harness.hostile import MIB, ArmedLoop, Budget, timed


def _quadratic(data: bytes) -> int:
    # what math.prod over a client's shape did in the bridge: work that grows with n * n
    return sum(data.count(data[i : i + 1]) for i in range(len(data)))


def _linear(data: bytes) -> int:
    return data.count(b"a")


def test_a_quadratic_parse_breaks_the_budget_and_a_linear_one_keeps_it() -> None:
    data = b"ab" * 20_000
    budget = Budget()
    linear = timed(_linear, data)
    budget.check("linear", len(data), linear.spent)
    quadratic = timed(_quadratic, data)
    with pytest.raises(AssertionError, match="ms of CPU for 40,000 bytes"):
        budget.check("quadratic", len(data), quadratic.spent)


def test_timed_keeps_what_the_parse_raised() -> None:
    outcome = timed(int, "not a number")
    assert isinstance(outcome.error, ValueError) and outcome.result is None


def test_a_timed_parse_is_not_traced_and_the_tracer_comes_back() -> None:
    """``make test`` runs under coverage: its line tracer costs a Python parser several times
    its own CPU (an 8 MiB body in one-byte chunks, 300 ms per MiB against a budget of 40). A
    timed parse runs with this thread's tracer off, and the tracer is back after."""
    seen: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            seen.append(frame.f_code.co_name)
        return tracer

    def parse_under_test() -> int:
        return sum(range(10))

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        assert timed(parse_under_test).result == 45
        parse_under_test()
    finally:
        sys.settrace(previous)
    assert seen.count("parse_under_test") == 1  # the call after, not the timed one


def test_the_budget_grows_with_the_input() -> None:
    assert Budget(per_mib=0.02, floor=0.01).allows(8 * MIB) == pytest.approx(0.17)


async def test_the_armed_loop_sees_a_blocked_loop_and_not_a_busy_one() -> None:
    async with ArmedLoop(stall_limit=0.2) as quiet:
        for _ in range(20):
            await asyncio.sleep(0.01)
    quiet.check()
    async with ArmedLoop(stall_limit=0.2) as blocked:
        await asyncio.sleep(0.05)
        time.sleep(0.5)  # noqa: ASYNC251 (the point: the loop held, as a quadratic parse holds it)
        await asyncio.sleep(0.05)
    with pytest.raises(AssertionError, match="the event loop stood"):
        blocked.check()
    assert 0.3 < blocked.longest < 2.0
