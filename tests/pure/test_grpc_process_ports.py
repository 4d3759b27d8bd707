"""A gRPC upstream of several addresses: the gateway's ``--grpc-process-ports`` (a port of its
own for each API process) and the proxy's ``--upstream-grpc`` list that spreads calls over them;
what each accepts and what it refuses by name."""

from __future__ import annotations

import pytest

from gateway_server.config import from_args
from hangup_contract.runtime.options import ConfigError
from proxy.config import build_config


def test_the_gateway_takes_a_first_port_or_ephemeral_ones() -> None:
    assert from_args([], {}).grpc_process_ports is None
    four = ["--workers", "4", "--api-processes", "4"]
    assert from_args([*four, "--grpc-process-ports", "9100"], {}).grpc_process_ports == 9100
    assert from_args(four, {"HANGUP_GATEWAY_GRPC_PROCESS_PORTS": "0"}).grpc_process_ports == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grpc-process-ports", "-1"], "--grpc-process-ports='-1': expected a port"),
        (["--grpc-process-ports", "65536"], "--grpc-process-ports='65536': expected a port"),
        # the last of four processes' ports would be 65536
        (["--workers", "4", "--api-processes", "4", "--grpc-process-ports", "65533"], "65536"),
        (["--grpc-process-ports", "ninety"], "--grpc-process-ports"),
    ],
)
def test_the_gateway_refuses_ports_out_of_range(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_args(argv, {})


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("gateway:8001", "gateway:8001"),  # one address: a name is fine
        ("unix:/run/gateway.sock", "unix:/run/gateway.sock"),  # and so is a target grpc resolves
        ("dns:///gateway:8001", "dns:///gateway:8001"),
        ("127.0.0.1:8100, 127.0.0.1:8101", "127.0.0.1:8100,127.0.0.1:8101"),
        ("[::1]:8100,[::1]:8101", "[::1]:8100,[::1]:8101"),
    ],
)
def test_the_proxy_takes_one_address_or_several_ip_addresses(given: str, kept: str) -> None:
    assert build_config(["--upstream-grpc", given], {}).upstream_grpc == kept


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("gateway", "not host:port: 'gateway'"),
        ("127.0.0.1:8100,127.0.0.1:0", "not host:port: '127.0.0.1:0'"),
        ("localhost:8100,localhost:8101", "must be IP addresses"),
        ("127.0.0.1:8100,[::1]:8101", "all IPv4 or all IPv6"),
        ("::1:8100,::1:8101", "in brackets"),
        (" , ", "expected host:port"),
    ],
)
def test_the_proxy_refuses_a_list_grpc_cannot_spread_over(given: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--upstream-grpc") as refused:
        build_config(["--upstream-grpc", given], {})
    assert message in str(refused.value)
