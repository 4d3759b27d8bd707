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

from bench.base.processes import REPO
from tests.support.references import missing_paths

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


def what_hangup_adds(text: str) -> str:
    """The section that answers "what does hangup add for my server", its links as the site's."""
    start = text.index("## What hangup adds for your server")
    section = text[start : text.index("\n## ", start + 1)].partition("![")[0]
    lines = [line for line in section.splitlines() if not line.startswith("<!--")]
    return "\n".join(lines).replace("](docs/", "](").strip()


def test_the_sites_home_and_the_readme_say_the_same_of_what_hangup_adds() -> None:
    """The table a newcomer reads first is one text in two places: its figures change in both."""
    readme = what_hangup_adds((REPO / "README.md").read_text())
    assert "| `vllm serve` |" in readme and "| Triton, HTTP |" in readme
    assert what_hangup_adds((REPO / "docs" / "index.md").read_text()) == readme


def pages_a_reader_meets() -> list[Path]:
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    pages += [REPO / "charts" / "hangup" / "README.md", REPO / "CHANGELOG.md"]
    return [page for page in pages if page.exists()]


@pytest.mark.parametrize("page", pages_a_reader_meets(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    """A file named in backticks, in a command or by a link is one a reader can open; a page
    naming a file as it was once (a dated figure) names it as it is now, or not in backticks."""
    missing = missing_paths(page.read_text(), page.parent)
    assert not missing, f"{page.relative_to(REPO)} names what does not exist: {missing}"


def test_the_path_check_finds_an_old_file_a_stale_link_and_a_glob_matching_nothing() -> None:
    text = (
        "The cancel wire (`proxy/cancel_http.py`), [a page](gone.md#top), `tests/pure/*_nope.py`\n"
        "```sh\npython bench/cancel_write.py --calls 2  # not bench/nothing.py\n```\n"
        "`proxy/config.py:12`, `tests/tooling/test_skips.py::test_x`, `/v2/requests/{id}/cancel`\n"
    )
    missing = missing_paths(text, REPO / "docs")
    assert missing == [
        "link gone.md#top",
        "proxy/cancel_http.py",
        "tests/pure/*_nope.py",
        "bench/cancel_write.py",
    ]
