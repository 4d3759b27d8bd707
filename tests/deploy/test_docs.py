"""The documentation as a reader meets it: the site builds strictly (every page in the
navigation, every link between pages and every anchor resolving; `mkdocs.yml` turns each of
those warnings on and strict mode makes a warning fail the build), and every link of the README,
the front door, leads to a file of the checkout and, where it names one, to an anchor of the
built page. Links to other sites are not followed: tests stay on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.processes import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    pages = {p.stem for p in (REPO / "docs").glob("*.md")}
    built = {p.parent.name for p in site.glob("*/index.html")} | {"index"}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"


def test_every_link_of_the_readme_resolves(site: Path) -> None:
    readme = (REPO / "README.md").read_text()
    links = [target for target in LINK.findall(readme) if "://" not in target]
    assert links, "the README links to no page"
    for target in links:
        path, _, anchor = target.partition("#")
        assert path, f"{target}: the README has no anchors of its own to link to"
        assert (REPO / path).exists(), f"{target}: no such file"
        if anchor:
            page = Path(path)
            assert page.parts[0] == "docs" and page.suffix == ".md", f"{target}: not a docs page"
            html = site / (page.stem if page.stem != "index" else "") / "index.html"
            assert f'id="{anchor}"' in html.read_text(), f"{target}: no such anchor"
