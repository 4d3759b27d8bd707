"""The simulated engine's KV connector: what a prefill engine keeps for a decode engine, and
every way it is freed (pulled, released, lease, lost notification)."""

from __future__ import annotations

from gateway_server.engine.sim.kv import SavedKv, SimKvStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pull_frees_the_prefill_side_and_finds_nothing_the_second_time() -> None:
    store = SimKvStore()
    saved = SavedKv(store, 16)
    assert saved.save("call", 40, lease_s=30.0)[0] == 3  # 40 tokens in blocks of 16
    assert saved.blocks() == 3 and len(store) == 1
    assert store.pull("call") and saved.blocks() == 0 and len(store) == 0
    assert not store.pull("call")
    assert saved.release("call") == 0  # idempotent


def test_a_lease_frees_what_nobody_pulled_or_released() -> None:
    clock = Clock()
    store = SimKvStore()
    saved = SavedKv(store, 16, clock)
    saved.save("a", 16, lease_s=5.0)
    saved.save("b", 32, lease_s=50.0)
    clock.now += 5.0
    assert saved.blocks() == 2 and len(store) == 1  # "a" expired, "b" held
    assert not store.pull("a")
    assert saved.release("b") == 2 and saved.tokens() == 0


def test_a_lost_notification_keeps_the_blocks_until_the_gateway_releases_them() -> None:
    store = SimKvStore()
    saved = SavedKv(store, 16)
    saved.keep_on_pull = True
    saved.save("call", 64, lease_s=30.0)
    assert store.pull("call")  # the decode side loaded it; the prefill side was never told
    assert saved.blocks() == 4
    assert saved.release("call") == 4 and saved.blocks() == 0 and len(store) == 0
