"""The gateway's configuration: a listener on an address other than loopback with no cancel token
would serve the cancel API, ``GET /v2/requests`` and the fault switch to anyone; it is refused at
start unless asked for by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_server.config import from_args
from hangup_contract.runtime.options import ConfigError


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example", "[fe80::1]"])
def test_an_open_cancel_api_off_loopback_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="--allow-open-cancel-api"):
        from_args(["--host", host], {})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    assert from_args(["--host", host], {}).cancel_token is None


def test_a_token_or_the_flag_opens_another_address(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with_token = from_args(["--host", "0.0.0.0", "--cancel-token-file", str(token)], {})
    assert with_token.cancel_token == "s3cret"
    environ = {"HANGUP_GATEWAY_ALLOW_OPEN_CANCEL_API": "true"}
    assert from_args(["--host", "0.0.0.0"], environ).allow_open_cancel_api
