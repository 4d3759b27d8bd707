"""The catalog of benchmarks (``bench/catalog.py``, ``python -m bench``) lists every runnable
module under ``bench/`` and nothing else: each with a page section that exists, the make target
that runs it, and the same table as the top of ``docs/benchmarks.md``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bench.base.processes import REPO
from bench.catalog import CATALOG, Kind, Section, markdown, rooms

BEGIN = "<!-- python -m bench --markdown -->"
END = "<!-- end of python -m bench --markdown -->"


def has_main(path: Path) -> bool:
    """Whether the module runs something under ``if __name__ == "__main__":``."""
    for node in ast.parse(path.read_text()).body:
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
        ):
            return True
    return False


def runnable() -> set[str]:
    found = set()
    for path in (REPO / "bench").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if name != "bench.__main__" and has_main(path):
            found.add(name.removesuffix(".__main__"))  # a package's: python -m bench.<room>
    return found


def test_every_runnable_module_is_in_the_catalog() -> None:
    listed = {entry.module for entry in CATALOG}
    assert not runnable() - listed, f"not in bench/catalog.py: {sorted(runnable() - listed)}"


def test_the_catalog_names_only_modules_that_exist_and_run() -> None:
    modules = [entry.module for entry in CATALOG]
    assert len(modules) == len(set(modules)), "a module is listed twice"
    assert not set(modules) - runnable(), f"no such runnable module: {set(modules) - runnable()}"


def headings(page: str) -> set[str]:
    text = (REPO / "docs" / page).read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_every_section_named_is_a_heading_of_its_page() -> None:
    for entry in CATALOG:
        if entry.kind is Kind.HELPER:
            assert entry.figures is None, entry.module
            continue
        assert entry.figures is not None, f"{entry.module}: where do its figures go?"
        assert entry.figures.title in headings(entry.figures.page), entry


def test_the_section_anchor_is_the_one_the_site_makes() -> None:
    """The rule of Python-Markdown's ``toc`` (what mkdocs builds the site's anchors with)."""
    assert Section("x.md", "Hang-up → engine abort, through hangup").anchor == (
        "hang-up-engine-abort-through-hangup"
    )
    assert Section("x.md", "grpcio's own floor (2026-11-28, issue 51)").anchor == (
        "grpcios-own-floor-2026-11-28-issue-51"
    )
    assert Section("x.md", "In front of `vllm serve`: the proxy's").anchor == (
        "in-front-of-vllm-serve-the-proxys"
    )


def make_recipes() -> dict[str, str]:
    """Each Makefile target and its recipe lines."""
    recipes: dict[str, list[str]] = {}
    target = None
    continued = False  # the line before ended in a backslash: still the target's line
    for line in (REPO / "Makefile").read_text().splitlines():
        if continued:
            continued = line.endswith("\\")
            continue
        if match := re.match(r"^([\w.-]+):(?!=)", line):
            continued = line.endswith("\\")
            target = match.group(1)
            recipes.setdefault(target, [])
        elif line.startswith("\t") and target:
            recipes[target].append(line)
        elif line.strip() and not line.startswith("\t"):
            target = None
    return {name: "\n".join(lines) for name, lines in recipes.items()}


def test_make_targets_run_what_the_catalog_says() -> None:
    recipes = make_recipes()
    for entry in CATALOG:
        if entry.make:
            assert re.search(rf"-m {re.escape(entry.module)}\b", recipes[entry.make]), entry
    in_make = set(re.findall(r"-m (bench\.[\w.]+)", "\n".join(recipes.values())))
    assert in_make <= {entry.module for entry in CATALOG}, in_make


def test_every_room_says_what_it_asks() -> None:
    assert all(rooms().values()), rooms()


def test_the_docs_table_is_the_catalog() -> None:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert BEGIN in text and END in text, f"docs/benchmarks.md has no {BEGIN} ... {END} block"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == markdown(), "docs/benchmarks.md: paste `python -m bench --markdown` in again"


def test_every_entry_says_how_long_it_runs() -> None:
    """13 entries said "run time: unknown"; each is now timed, estimated or read from its page."""
    vague = [e.module for e in CATALOG if not e.run_time or "unknown" in e.run_time]
    assert not vague, f"no run time: {vague}"
