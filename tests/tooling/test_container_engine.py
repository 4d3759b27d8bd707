"""Finding a container engine (``tests.support.containers``) where a Docker engine is installed but
not running: its socket file is there, the kernel refuses every connection, and the image and pod
tests must go on to podman (or skip saying why), not crash `make test` before the suite starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import containers
from tests.support.containers import NoEngine, container_engine


@pytest.fixture
def stale_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket file nobody listens on: what a stopped Docker engine leaves behind."""
    path = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
    yield path


def test_a_refused_docker_socket_is_no_engine_and_says_where(
    stale_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{stale_socket}")
    monkeypatch.setattr(containers.shutil, "which", lambda name: None)
    with pytest.raises(NoEngine) as raised, container_engine():
        pytest.fail("a refused socket was taken for an engine")
    message = str(raised.value)
    assert str(stale_socket) in message
    assert "no podman" in message


def test_a_socket_file_counts_as_listening_only_once_something_accepts(
    stale_socket: Path, tmp_path: Path
) -> None:
    assert stale_socket.exists()
    assert not containers._listening(stale_socket)
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(live))
        server.listen(1)
        assert containers._listening(live)
