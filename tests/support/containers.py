"""A container engine for the image and pod tests: a Docker engine where one answers, else podman
through its Docker-compatible socket (started here for the session), else a skip that says how
to get one (`make container-host`, as root).

Both are driven with the Docker SDK, so the image tests read the same either way; the chart's pod
needs podman's own `kube play` (Docker has none). What the run used goes to the end of pytest's
output (``REPORT``): which engine, and which base image the Dockerfile's FROM found (the real
python image, or the stand-in `make container-host` makes from Debian's packages where no registry
answers).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.processes import REPO
from bench.base.waiting import poll_until
from bench.harness.unavailable import Unavailable

CPU_IMAGE = "localhost/hangup:test"
"""The name the tests build the CPU image under (the name podman gives a local build)."""
BASE = "docker.io/library/python:3.11.11-slim-bookworm"
"""The Dockerfile's base, by the name a pull stores it under."""
STAND_IN_LABEL = "org.hangup.stand-in"
SETUP_HINT = (
    "`make container-host` as root installs Debian's podman and the base image (CI runs it); "
    "or start a Docker engine"
)

REPORT: list[str] = []
"""Lines for the end of pytest's output (tests/deploy/conftest.py prints them)."""


class NoEngine(Unavailable):
    """No container engine here; the message says why and how to get one."""


@dataclass
class Engine:
    client: Any  # docker.DockerClient
    name: str
    podman: str | None  # podman's CLI, for `kube play`, where the engine is podman

    def base_description(self) -> str:
        """Which base the Dockerfile's FROM finds here, in words."""
        labels = self.client.images.get(BASE).attrs.get("Config", {}).get("Labels") or {}
        stand_in = labels.get(STAND_IN_LABEL)
        if stand_in:
            return f"a stand-in for {BASE} ({stand_in}; the real image has Python 3.11.11)"
        return BASE


def _client(base_url: str) -> Any:
    """A Docker SDK client on ``base_url`` that has answered a ping; NoEngine where nothing does.

    A socket file with nobody listening (a Docker engine installed but stopped, or one that died)
    is refused by the kernel: the SDK lets that through as requests' ConnectionError, not as a
    DockerException, so both are caught here."""
    import docker
    from docker.errors import DockerException
    from requests.exceptions import RequestException

    # A fixed API version: the SDK's "auto" probes the engine in its constructor and leaks the
    # socket when there is none.
    client = docker.DockerClient(base_url=base_url, version="1.41", timeout=300)
    try:
        client.ping()
    except (DockerException, RequestException) as exc:
        client.close()
        raise NoEngine(f"no engine answers at {base_url} ({exc})") from exc
    return client


def _listening(sock: Path) -> bool:
    """Whether something accepts connections on the unix socket ``sock`` (its file can exist a
    moment before the service listens on it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def podman_socket(podman: str) -> Iterator[str]:
    """`podman system service` on a socket of its own for as long as the block runs (and, should
    this process die without stopping it, five minutes idle)."""
    with tempfile.TemporaryDirectory(prefix="hangup-podman-") as tmp:
        sock = Path(tmp) / "podman.sock"
        service = subprocess.Popen(
            [podman, "system", "service", "--time=300", f"unix://{sock}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=False,
        )
        try:
            poll_until(
                lambda: _listening(sock) or service.poll() is not None,
                within=30,
                what="podman's API socket",
            )
            if service.poll() is not None:
                stderr = service.stderr.read().decode() if service.stderr else ""
                raise NoEngine(f"podman system service exited: {stderr.strip()}")
            yield f"unix://{sock}"
        finally:
            service.terminate()
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
            if service.stderr:
                service.stderr.close()


@contextlib.contextmanager
def container_engine() -> Iterator[Engine]:
    """A Docker engine where DOCKER_HOST or /var/run/docker.sock answers; else podman, once
    `make container-host` has put the base image in its store; else NoEngine."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    path = Path(host.removeprefix("unix://")) if host.startswith("unix://") else None
    if path is not None and not path.exists():
        docker_reason = f"no Docker engine at {host}"
    elif path is not None and not _listening(path):
        # Probed before the SDK sees it: the SDK leaks its socket when a connect is refused.
        docker_reason = f"no Docker engine listens at {host} (a stopped engine's socket file)"
    else:
        try:
            client = _client(host)
        except NoEngine as exc:
            docker_reason = str(exc)
        else:
            try:
                version = client.version().get("Version", "?")
                yield Engine(client, f"Docker {version} at {host}", shutil.which("podman"))
            finally:
                client.close()
            return
    podman = shutil.which("podman")
    if podman is None:
        raise NoEngine(f"{docker_reason} and no podman: {SETUP_HINT}")
    has_base = subprocess.run([podman, "image", "exists", BASE], capture_output=True, timeout=60)
    if has_base.returncode != 0:
        raise NoEngine(f"{docker_reason}; podman has no {BASE}: {SETUP_HINT}")
    with podman_socket(podman) as url:
        client = _client(url)
        try:
            version = client.version().get("Version", "?")
            yield Engine(client, f"podman {version} through its Docker-compatible socket", podman)
        finally:
            client.close()


def build_cpu_image(engine: Engine, tag: str) -> Any:
    """The CPU image, built from the Dockerfile as it is (the build's pip reaches PyPI on the
    host's network)."""
    image, _ = engine.client.images.build(
        path=str(REPO), dockerfile="Dockerfile", tag=tag, rm=True, network_mode="host"
    )
    return image


def main() -> None:
    """``python -m tests.support.containers``: the CPU image built as the tests build it, ahead of
    them (`make container-image`, beside the other installs: the tests' build then finds every
    layer cached)."""
    with container_engine() as engine:
        build_cpu_image(engine, CPU_IMAGE)
        print(f"built {CPU_IMAGE} with {engine.name}, on {engine.base_description()}")


if __name__ == "__main__":
    main()
