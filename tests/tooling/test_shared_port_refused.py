"""``tests.support.shared_port.refused``: what a client sees of a listener that has gone."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import shared_port


@pytest.mark.parametrize("error", [ConnectionRefusedError, ConnectionResetError])
async def test_a_connect_refused_or_reset_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, error: type[OSError]
) -> None:
    """A connect the kernel resets (a handshake still queued when the listener closed) is as
    much a refusal as one refused outright: neither leaves the client held."""

    async def connect(host: str, port: int) -> None:
        raise error(104, "Connect call failed")

    monkeypatch.setattr(asyncio, "open_connection", connect)
    assert await shared_port.refused("127.0.0.1:9") is True
