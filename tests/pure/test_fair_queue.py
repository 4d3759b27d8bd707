"""The fair admission queue: clients in turn, each client's calls in turn, FIFO within a call;
a cancel takes an item out of turn. (What a long queue costs: tests/hostile/test_sim_engine.py.)"""

from __future__ import annotations

import pytest

from gateway_server.engine.base import Share
from gateway_server.engine.fair import FairQueue


def drain(queue: FairQueue[str]) -> list[str]:
    return [queue.pop() for _ in range(len(queue))]


def test_clients_take_turns_then_each_clients_calls() -> None:
    queue = FairQueue[str]()
    for i in range(3):
        queue.push(Share("a", "a1"), f"a1-{i}", f"a1-{i}")
    queue.push(Share("a", "a2"), "a2-0", "a2-0")
    queue.push(Share("b", "b1"), "b1-0", "b1-0")
    queue.push(Share("b", "b1"), "b1-1", "b1-1")
    assert drain(queue) == ["a1-0", "b1-0", "a2-0", "b1-1", "a1-1", "a1-2"]
    assert not queue and len(queue) == 0


def test_a_call_with_thousands_waiting_delays_a_later_calls_first_by_one() -> None:
    queue = FairQueue[str]()
    for i in range(20_000):
        queue.push(Share("", "flood"), str(i), f"flood-{i}")
    queue.push(Share("", "victim"), "v", "victim")
    assert [queue.pop() for _ in range(2)] == ["flood-0", "victim"]
    assert len(queue) == 19_999


def test_a_client_that_comes_back_joins_at_the_back() -> None:
    queue = FairQueue[str]()
    queue.push(Share("a", "1"), "a", "a")
    queue.push(Share("b", "2"), "b", "b")
    assert queue.pop() == "a"
    queue.push(Share("a", "3"), "a2", "a2")
    assert drain(queue) == ["b", "a2"]


def test_remove_takes_an_item_out_of_turn_and_forgets_empty_calls_and_clients() -> None:
    queue = FairQueue[str]()
    queue.push(Share("a", "1"), "x", "x")
    queue.push(Share("a", "1"), "y", "y")
    queue.push(Share("b", "2"), "z", "z")
    assert queue.remove(Share("a", "1"), "x") == "x"
    assert queue.remove(Share("a", "1"), "x") is None  # idempotent
    assert queue.remove(Share("c", "1"), "x") is None  # never there
    assert queue.remove(Share("b", "2"), "z") == "z"
    assert sorted(queue) == ["y"] and len(queue) == 1
    assert queue.pop() == "y"
    with pytest.raises(IndexError):
        queue.pop()
