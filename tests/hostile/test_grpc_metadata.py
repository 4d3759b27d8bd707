"""The gRPC relay's reading of a call's metadata (``proxy.grpc.metadata``, the call's ids) and of
its peer (``proxy.grpc.peer.parse_peer``) fed hostile input up to grpc-core's metadata limit
(16 KiB as HPACK counts it): many entries, long ids, reserved and binary keys, peers of
thousands of digits (``bench/harness/hostile_parsers.py``). Each within the default budget (20 ms
per MiB + 10 ms), answering metadata or ``BadRequestId`` (``INVALID_ARGUMENT``) only. The long
run is ``python -m bench.robustness.hostile``."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from bench.harness.hostile_parsers import PARSERS, PHASES
from proxy.grpc.peer import parse_peer

PARSER = PARSERS["grpc-metadata"]
HOSTILE = settings(
    max_examples=100, derandomize=True, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), phases=PHASES,
)  # fmt: skip


def test_the_costliest_inputs_known_keep_the_budget() -> None:
    for case in PARSER.worst():
        PARSER.check(case)


@HOSTILE
@given(PARSER.inputs)
def test_hostile_metadata_keeps_the_budget_and_gets_only_invalid_argument(case: object) -> None:
    PARSER.check(case)


def test_a_peer_of_a_port_no_socket_has_is_no_address() -> None:
    """A port of 5,000 digits raised ValueError (int()'s digit limit) where None belongs."""
    assert parse_peer("ipv4:1.2.3.4:" + "9" * 5000) is None
    assert parse_peer("ipv4:1.2.3.4:655350") is None
    assert parse_peer("ipv4:1.2.3.4:5") is not None
