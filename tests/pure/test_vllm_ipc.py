"""The directory of vLLM's IPC sockets (``gateway_server.engine.vllm.ipc``): an engine's socket
files are found as it starts and unlinked as it stops, so engines that die and come back leave
nothing behind; a directory the operator chose is never touched. (The real engine's files:
``tests/vllm/test_vllm_workers.py``.)"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_server.engine.vllm.ipc import OWNER, PREFIX, RPC_BASE_PATH, IpcDirectory


@pytest.fixture
def temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No VLLM_RPC_BASE_PATH, and a temporary directory of the test's own (short, as a unix
    socket's path must be: pytest's own are too deep)."""
    with tempfile.TemporaryDirectory(prefix="hangup-t-") as path:
        # Recorded, then removed: the code under test sets the variable, and a value left in this
        # process would reach every server a later test starts (delenv alone records nothing
        # when the variable is not set).
        monkeypatch.setenv(RPC_BASE_PATH, "")
        monkeypatch.delenv(RPC_BASE_PATH)
        monkeypatch.setattr(tempfile, "tempdir", path)
        yield Path(path)


def engine_start(count: int) -> list[Path]:
    """What a vLLM start does to the directory: socket files named by uuid, never unlinked."""
    base = Path(os.environ[RPC_BASE_PATH])
    files = [base / str(uuid.uuid4()) for _ in range(count)]
    for file in files:
        file.touch()
    return files


def sockets(directory: Path) -> list[Path]:
    """What vLLM made in ``directory`` (its owner file aside)."""
    return [p for p in directory.iterdir() if p.name != OWNER]


def test_each_engine_unlinks_only_its_own_sockets_as_it_stops(temp: Path) -> None:
    ipc = IpcDirectory()
    with ipc.files_made() as first:
        first_files = engine_start(3)
    assert ipc.path is not None and ipc.path.parent == temp and ipc.path.name.startswith(PREFIX)
    assert os.environ[RPC_BASE_PATH] == str(ipc.path)
    with ipc.files_made() as second:
        second_files = engine_start(2)
    assert first == set(first_files) and second == set(second_files)

    ipc.remove(first)  # the first engine died: the next start must not find its files
    assert sorted(sockets(ipc.path)) == sorted(second_files)
    ipc.remove(first)  # twice: a shutdown is idempotent
    with ipc.files_made() as restarted:
        engine_start(3)
    ipc.remove(second)
    ipc.remove(restarted)
    assert not sockets(ipc.path)


def test_a_start_that_fails_still_owns_what_it_made(temp: Path) -> None:
    ipc = IpcDirectory()
    with pytest.raises(RuntimeError), ipc.files_made() as made:
        engine_start(2)
        raise RuntimeError("the model did not load")
    assert len(made) == 2
    ipc.remove(made)
    assert ipc.path is not None and not sockets(ipc.path)


def test_the_operators_directory_is_never_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    monkeypatch.setenv(RPC_BASE_PATH, str(theirs))
    ipc = IpcDirectory()
    with ipc.files_made() as made:
        files = engine_start(2)
    assert ipc.path is None and not made
    ipc.remove(made)
    assert all(file.exists() for file in files)
    assert os.environ[RPC_BASE_PATH] == str(theirs)


def test_no_directory_where_a_socket_in_it_could_not_be_bound(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TMPDIR of 60 characters: a socket there fits a unix socket's 107, one in a directory
    under it would not. vLLM keeps its default (TMPDIR itself), and nothing is made there."""
    deep = temp / ("d" * (60 - len(str(temp)) - 1))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    ipc = IpcDirectory()
    with ipc.files_made() as made:
        pass
    assert ipc.path is None and not made
    assert RPC_BASE_PATH not in os.environ
    assert not list(deep.iterdir())


def test_a_directory_whose_process_died_is_removed_by_the_next_one(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed outright leaves its directory; the next process to make one in the same
    place removes it (its owner lock is free), and never a live process's, nor a directory that
    has no owner file (not ours to judge)."""
    dead = IpcDirectory()
    with dead.files_made():
        engine_start(7)
    assert dead.path is not None
    os.close(dead._owner)  # what the kernel does when the process is killed
    monkeypatch.delenv(RPC_BASE_PATH)  # the next process starts without it
    live = IpcDirectory()
    with live.files_made():
        engine_start(7)
    foreign = temp / f"{PREFIX}foreign1"
    foreign.mkdir()

    monkeypatch.delenv(RPC_BASE_PATH)
    restarted = IpcDirectory()
    with restarted.files_made():
        engine_start(7)
    assert live.path is not None and restarted.path is not None
    assert sorted(p.name for p in temp.iterdir()) == sorted(
        [live.path.name, restarted.path.name, foreign.name]
    )
    assert not dead.path.exists()
    assert len(sockets(live.path)) == 7
