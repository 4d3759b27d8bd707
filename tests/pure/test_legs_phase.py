"""The phase of a disaggregated request, read from its legs, at the edges of their lives."""

from __future__ import annotations

from types import SimpleNamespace

from gateway_server.placement.legs import Legs, LegState
from hangup_contract.cancel_labels import Phase


class Engine:
    """An engine that knows the phase of the legs it runs, and forgets a leg once it ended."""

    def __init__(self) -> None:
        self.phases: dict[str, Phase] = {}

    def phase(self, request_id: str) -> Phase | None:
        return self.phases.get(request_id)


def bound(legs: Legs) -> tuple[Engine, Engine]:
    prefill, decode = Engine(), Engine()
    legs.prefill.bind(SimpleNamespace(engine=prefill, name="0"))  # type: ignore[arg-type]
    return prefill, decode


def test_a_request_whose_decode_leg_ended_is_in_decode_while_its_kv_is_released() -> None:
    legs = Legs("c1-1")
    _, decode = bound(legs)
    legs.prefill.state, legs.prefilled = LegState.ENDED, True
    legs.decode.bind(SimpleNamespace(engine=decode, name="1"))  # type: ignore[arg-type]
    decode.phases[legs.decode.request_id] = Phase.DECODE
    assert legs.phase(started_decode=True) is Phase.DECODE
    legs.decode.state = LegState.ENDED  # its last token is out; the engine forgot it
    del decode.phases[legs.decode.request_id]
    assert legs.phase(started_decode=True) is Phase.DECODE  # a hang-up now is one in decode
    assert not legs.holds_handoff


def test_a_held_phase_outlives_the_engine_forgetting_the_leg() -> None:
    legs = Legs("c1-1")
    prefill, _ = bound(legs)
    prefill.phases[legs.prefill.request_id] = Phase.PREFILL
    legs.hold_phase(started_decode=False)  # the client hung up in prefill
    del prefill.phases[legs.prefill.request_id]  # the engine applied the abort
    assert legs.phase(started_decode=False) is Phase.PREFILL
