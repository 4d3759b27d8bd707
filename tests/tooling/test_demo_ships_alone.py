"""The demos run in the image, which ships them, what they import of ``bench/`` and hangup's base
dependencies, but not the rest of ``bench/``, the test suite or its extras (``.dockerignore``,
``Dockerfile``): nothing a demo imports, however deep, may come from ``tests``, nor from a package
hangup does not depend on (pytest, Hypothesis, tritonclient...); everything it imports of
``bench/`` is copied into the image, and nothing else of ``bench/`` is."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from bench.base.processes import REPO
from bench.catalog import CATALOG, Kind

DEMOS = [entry.module for entry in CATALOG if entry.kind is Kind.DEMO]  # the Dockerfile advertises
FIRST_PARTY = ("bench", "hangup_contract", "gateway_server", "proxy")
BASE = {  # what pyproject's `dependencies` install, by the name a module imports
    "aiohttp", "httptools", "uvloop", "prometheus_client", "grpc", "grpc_health",
    "grpc_reflection", "google",
}  # fmt: skip


def module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reached(demo: str) -> set[str]:
    """Every module ``demo`` imports, however deep through first-party modules."""
    seen, todo = set(), [demo]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] in FIRST_PARTY and (path := module_file(name)):
            todo.extend(imported(path))
    return seen


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_imports_nothing_from_the_test_suite(demo: str) -> None:
    from_tests = sorted(n for n in reached(demo) if n.split(".")[0] == "tests")
    assert not from_tests, f"{demo} imports the test suite: {from_tests}"


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_needs_only_the_base_dependencies(demo: str) -> None:
    tops = {n.split(".")[0] for n in reached(demo)}
    allowed = set(sys.stdlib_module_names) | set(FIRST_PARTY) | BASE | {"__future__", "tests"}
    assert tops <= allowed, f"{demo} imports what the image lacks: {sorted(tops - allowed)}"


def copied_from_bench() -> list[Path]:
    """What the CPU image's last stage copies of ``bench/`` from the build context."""
    last_stage = (REPO / "Dockerfile").read_text().split("\nFROM ")[-1]
    sources = re.findall(r"^COPY (?!--from)(\S+) \S+$", last_stage, flags=re.MULTILINE)
    return [REPO / source for source in sources if source.split("/")[0] == "bench"]


def shipped(path: Path, copied: list[Path]) -> bool:
    return any(path == source or source in path.parents for source in copied)


def demo_files() -> set[Path]:
    """Every file of ``bench/`` the demos import, their packages' ``__init__.py`` included."""
    names = {name for demo in DEMOS for name in reached(demo) if name.split(".")[0] == "bench"}
    names |= {
        ".".join(name.split(".")[:i]) for name in names for i in range(1, name.count(".") + 1)
    }
    return {path for name in names if (path := module_file(name))}


def test_the_image_copies_what_the_demos_import_of_bench() -> None:
    copied = copied_from_bench()
    missing = sorted(str(p.relative_to(REPO)) for p in demo_files() if not shipped(p, copied))
    assert not missing, f"the Dockerfile does not copy what a demo imports: {missing}"


def test_the_image_copies_nothing_else_of_bench() -> None:
    copied, needed = copied_from_bench(), demo_files()
    files = {
        p for source in copied for p in ([source] if source.is_file() else source.rglob("*.py"))
    }
    extra = sorted(str(p.relative_to(REPO)) for p in files - needed)
    assert copied and not extra, f"the Dockerfile copies what no demo imports: {extra}"
